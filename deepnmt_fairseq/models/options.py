"""Command-line options of the deep Transformer family (one dataclass, one place).

Every field becomes a ``--flag`` of ``--arch deepnmt_transformer`` and of every
named architecture registered on it; named architectures only set defaults, so
flags given on the command line always win.
"""


from dataclasses import MISSING, dataclass, field, fields
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..memories import MEMORIES

MEMORY_CHOICES = ChoiceEnum(list(MEMORIES))
FUSION_CHOICES = ChoiceEnum(["gate", "add"])
CONTEXT_CELL_CHOICES = ChoiceEnum(["gru", "ffn", "none"])
SKIP_MODE_CHOICES = ChoiceEnum(["sublayer", "layer"])
SUBLAYER_CHOICES = ChoiceEnum(["both", "attn", "ffn"])
CAD_READING_CHOICES = ChoiceEnum(["consistent", "literal"])


class _FromArgs:
    """``from_args``: the options of a dataclass read from an argparse namespace or a TransformerConfig."""

    @classmethod
    def from_args(cls, args):
        """Read the options from an argparse namespace or a TransformerConfig (values not given keep
        their defaults)."""
        opts = cls()
        for f in fields(cls):
            value = getattr(args, f.name, None)
            if value is not None:
                setattr(opts, f.name, value)
        return opts


@dataclass
class DeepTransformerOptions(_FromArgs, FairseqDataclass):
    post_norm: bool = field(
        default=False,
        metadata={
            "help": "post-norm layers (LayerNorm after each residual, Vaswani et al. 2017) in "
            "encoder and decoder instead of this plugin's pre-norm default (Wang et al. 2019a); "
            "the 'plain deep stacks fail' baselines"
        },
    )
    # ---- residual scaling for deep post-norm stacks -----------------------
    deepnorm: bool = field(
        default=False,
        metadata={
            "help": "DeepNorm (Wang et al. 2022, DeepNet, arXiv 2203.00555, Sec. 3): post-norm "
            "sub-layers x <- LN(alpha*x + G(x)) and Xavier-normal init with gain beta on the FFN, "
            "value and output projections (gain 1 on query/key); alpha, beta from the paper's "
            "encoder-decoder formulas for this model's N encoder and M decoder layers. Implies "
            "--post-norm"
        },
    )
    deepnorm_alpha_beta: Optional[str] = field(
        default=None,
        metadata={
            "help": "DeepNorm: override the paper's constants, 'enc_alpha,enc_beta,dec_alpha,dec_beta' "
            "(default: computed from the depths; a student keeps an explicit override)"
        },
    )
    admin: bool = field(
        default=False,
        metadata={
            "help": "Admin (Liu et al. 2020, arXiv 2004.08249, Sec. 5): post-norm sub-layers "
            "x_i = LN(x_{i-1}*omega_i + f_i(x_{i-1})), omega_i a learnable vector set from the "
            "output variances of the earlier sub-layers, profiled on the first training batch "
            "(once; recorded in the checkpoint, not repeated on resume). Implies --post-norm"
        },
    )
    no_encoder_residual: bool = field(
        default=False,
        metadata={
            "help": "remove the residual connections of the encoder layers (Bapna et al. 2018 "
            "Table 1, 'Baseline - residuals')"
        },
    )
    # ---- what each decoder layer attends to ------------------------------
    deep_memory: MEMORY_CHOICES = field(
        default="top",
        metadata={
            "help": "what each decoder layer attends to: 'top' = the last encoder layer "
            "(Vaswani et al. 2017); 'transparent' = its own learned softmax mix of all "
            "encoder layer outputs, embeddings included (Bapna et al. 2018, Eq. 1-2); "
            "'msc' = encoder block n and context state C^n for decoder layer n "
            "(Wei et al. 2020, Eq. 7, 11, 13); 'dlcl' = the top of an encoder whose every "
            "layer reads a learned combination of all layers below it (Wang et al. 2019a, "
            "pre-norm DLCL)"
        },
    )
    # ---- MSC (Wei et al. 2020) --------------------------------------------
    msc_block_layers: Optional[str] = field(
        default=None,
        metadata={
            "help": "MSC: layers per encoder block, one M for all N blocks or a comma "
            "list M_1,...,M_N (Eq. 5-6). N is --decoder-layers; --encoder-layers must "
            "equal the sum (it is derived when not given)"
        },
    )
    msc_fusion: FUSION_CHOICES = field(
        default="gate",
        metadata={
            "help": "MSC feature fusion: 'gate' g*ATTN_h + (1-g)*ATTN_c with "
            "g = sigmoid(W1 ATTN_h + W2 ATTN_c + b) (Eq. 12-13), or 'add' (Table 5 ablation)"
        },
    )
    msc_context_cell: CONTEXT_CELL_CHOICES = field(
        default="gru",
        metadata={
            "help": "MSC contextual collaboration cell Q of Eq. 9: 'gru' (shared GRU "
            "cell), 'ffn' (Table 5 ablation) or 'none' (no contextual collaboration: "
            "pure block-scale collaboration, Table 5)"
        },
    )
    msc_count_fitting_norms: bool = field(
        default=False,
        metadata={
            "help": "MSC encoder layers: add a LayerNorm on ATTN_c's query and one on the gate's "
            "pre-activation, g = sigmoid(LN(W1 ATTN_h + W2 ATTN_c + b)). Not in the paper (Eq. 12 "
            "has neither); they reproduce Table 2's parameter counts to 0.1M. Default: the literal "
            "Eq. 12 gate. Checkpoints trained with them are recognised by their weights and loaded "
            "with them (docs/parameter-counts.md)"
        },
    )
    msc_no_encoder_context: bool = field(
        default=False,
        metadata={
            "help": "MSC ablation 'remove CXT-ENC attention' (Table 5): encoder layers do "
            "not attend to C^{n-1} (Eq. 10-12); the decoder still attends to C^n (Eq. 13)"
        },
    )
    # ---- transparent attention (Bapna et al. 2018) ------------------------
    transparent_dropout: float = field(
        default=0.1,
        metadata={
            "help": "dropout on the transparent-attention weight matrix W before the "
            "softmax (Eq. 1; the paper gives no value)"
        },
    )
    # ---- cross-attention drop (deep-decoder paper, Sec. 3.3) ---------------
    cad_drop_depth: int = field(
        default=0,
        metadata={
            "help": "CAD drop depth L_dr: decoder layers 1..L_dr drop their cross-attention "
            "with probability --cad-drop-ratio; layers above always keep it (our reading "
            "of Sec. 3.3 vs Sec. 4.3, see docs)"
        },
    )
    cad_drop_ratio: float = field(
        default=0.0,
        metadata={
            "help": "CAD drop ratio p_net. 0 < p < 1 = dropped in training only, used at inference "
            "(Sec. 3.3: 'During the inference stage, both attentions are used'). 1.0 = layers "
            "1..L_dr are built without cross-attention, also at inference: it would never be "
            "trained (our reading, see modules/cross_attention_drop.py)"
        },
    )
    cad_reading: CAD_READING_CHOICES = field(
        default="consistent",
        metadata={
            "help": "how CAD reads Sec. 3.3. 'consistent' (default, our reading): layers above the drop "
            "depth keep their cross-attention (p^l = 0), agreeing with Sec. 4.3, and p_net = 1.0 layers are "
            "built without it. 'literal': the letter of Sec. 3.3, p^l = 1.0 above the drop depth (never "
            "used in training) and every layer's cross-attention used at inference ('During the inference "
            "stage, both attentions are used'); it refuses p_net = 1.0 and drop depth 0, where no "
            "cross-attention would ever be trained"
        },
    )
    # ---- skipping sub-layer (Li et al. 2021, Eq. 3-6) ---------------------
    ssl_rate: float = field(
        default=0.0,
        metadata={
            "help": "skipping sub-layer phi: sub-layer l of 2L is omitted in training with "
            "p_l = l/(2L)*phi and scaled by 1-p_l at inference (Eq. 5-6; paper: 0.4). "
            "0 disables"
        },
    )
    ssl_mode: SKIP_MODE_CHOICES = field(
        default="sublayer",
        metadata={
            "help": "'sublayer' = skipping sub-layer (Li et al. 2021); 'layer' = "
            "Stochastic Layers (Pham et al. 2019): whole layers with p_l = l/L*rate (Table 4)"
        },
    )
    ssl_sublayers: SUBLAYER_CHOICES = field(
        default="both",
        metadata={
            "help": "which sub-layers may be skipped (Li et al. 2021 Table 5): 'both' (default), "
            "'attn' (Skip SAN) or 'ffn' (Skip FFN); p_l keeps its position l in the 2L numbering"
        },
    )
    ssl_decoder: bool = field(
        default=False, metadata={"help": "also skip decoder sub-layers (default: encoder only)"}
    )
    ssl_start_update: int = field(
        default=0,
        metadata={
            "help": "two-stage training: skipping starts after this many updates "
            "(the paper fine-tunes a converged model; 0 = from the start)"
        },
    )
    # ---- group permutation (Li et al. 2021) -------------------------------
    gp_group_size: int = field(
        default=1,
        metadata={
            "help": "GP: encoder layers are permuted in training within contiguous groups "
            "of h layers (h = N/M); 1 disables"
        },
    )
    gp_decoder_group_size: int = field(
        default=1, metadata={"help": "GP for the decoder layers (DESDAR students); 1 disables"}
    )
    # ---- relative positions (Shaw et al. 2018, as used by GPKD) -----------
    rpr_max_relative_position: int = field(
        default=0,
        metadata={
            "help": "relative position representations in self-attention with clipping "
            "distance k (GPKD uses k=8); 0 disables"
        },
    )
    rpr_values: bool = field(
        default=False, metadata={"help": "also add relative position embeddings to the values"}
    )


@dataclass
class HierTransOptions(_FromArgs, FairseqDataclass):
    """Options of ``--arch hiertrans`` (MSC Appendix A's HIERTRANS baseline, models/hiertrans.py)
    beyond fairseq's Transformer flags; ``--encoder-layers`` is the sentence-level encoder's depth."""

    document_layers: int = field(
        default=6,
        metadata={
            "help": "HIERTRANS: layers of the document-level encoder over the sentence vectors (MSC Appendix A: "
            "'both encoders are the same ... L = 18'); --encoder-layers is the sentence-level encoder's"
        },
    )
    sentence_end_symbols: str = field(
        default=". ! ?",
        metadata={
            "help": "HIERTRANS: space-separated dictionary symbols that end a sentence of the source document "
            "(the document's last token always does); our reading, the paper does not say how sentences are "
            "found"
        },
    )


#: options that change another option's default: DeepNorm and Admin are post-norm methods
IMPLIED_DEFAULTS = {"deepnorm": {"post_norm": True}, "admin": {"post_norm": True}}


def set_defaults(args, **defaults) -> None:
    """``args.key = value`` for each key ``args`` lacks: the defaults of a named architecture
    (flags given on the command line are present in ``args`` and win)."""
    for key, value in defaults.items():
        setattr(args, key, getattr(args, key, value))


def set_option_defaults(args, options=DeepTransformerOptions) -> None:
    """Give every option of the dataclass ``options`` that ``args`` lacks its default: first the
    defaults an enabled option implies (:data:`IMPLIED_DEFAULTS`), then the dataclass's."""
    for option, implied in IMPLIED_DEFAULTS.items():
        if getattr(args, option, False):
            set_defaults(args, **implied)
    set_defaults(args, **{f.name: f.default for f in fields(options)
                          if not f.name.startswith("_") and f.default is not MISSING})
