"""Train deep, serve shallow (``deepnmt-distill``, docs/distill.md) and the one GPKD planner.

* :mod:`.plan`: the GPKD / distillation procedure as data (stages: commands, inputs, outputs),
  the h rule, teacher training in one or two stages, SKD, extraction, export;
* :mod:`.pipeline`: from a trained teacher to an exported student, checked before any work;
* :mod:`.run`: running stages (skip when done, resume, progress, the settings guard);
* :mod:`.report`: quality, speed and size in one run (markdown + JSON).
"""
