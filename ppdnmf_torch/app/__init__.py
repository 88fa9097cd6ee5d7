"""The app: the ``ppdnmf`` command and everything a run of it writes, for every model.

* :mod:`.cli`: the Hydra app (``ppdnmf``, ``python -m ppdnmf_torch``); :mod:`.distributed`
  the same over several ranks (``python -m ppdnmf_torch.distributed``);
* :mod:`.runner`: one run without Hydra (folder, lock, logger, summary), for every model,
  through the task interface (:mod:`.tasks`: :class:`~.tasks.base.Task`, one module per
  model, ``task=<name>``);
* :mod:`.outputs`, :mod:`.figures`, :mod:`.loggers`, :mod:`.tensorboard`, :mod:`.progress`,
  :mod:`.costs`, :mod:`.rundir`: the files, the PNG figures, the TensorBoard layout, the
  progress lines, the cost estimate, the run folder's lock and guard;
* :mod:`.resume` (``resume=``), :mod:`.help` (``--help``), :mod:`.config_dir` (``conf/``).

The app imports the engine and the models; nothing below it imports the app
(``tests/test_architecture.py``; docs/ARCHITECTURE.md).
"""
