"""The project's ``--help`` layout, shared by every console script (deepnmt_cli, deepnmt_data and
deepnmt-translate).  It lives in this package because the serving distribution ships
deepnmt_deploy alone; the standard library is all it needs."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written (plain text, examples keep their lines) and every option's
    default after its help text, unless the text already says what the default is."""

    def _get_help_string(self, action):
        if "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)
