"""The privacy audit of PPDNMF runs: recording a run (:func:`record_fit`), the named scenarios
and :func:`run_audit` (:mod:`.run`), and the incremental X-step's token adversaries
(:mod:`.incremental`). The attacks themselves, on any recording of the exchange, are the
engine's: :mod:`ppdnmf_torch.audit`.
"""
from .incremental import (TokenRecorder, TokenRecording, curious_agent_incremental, eavesdropper_incremental,
                          incremental_audit, record_incremental_fit)
from .record import record_fit
from .run import ALL_SCENARIOS, SCENARIOS, fitting_n_max, run_audit

__all__ = ["record_fit", "run_audit", "SCENARIOS", "ALL_SCENARIOS", "fitting_n_max", "record_incremental_fit", "eavesdropper_incremental",
           "curious_agent_incremental", "incremental_audit", "TokenRecorder", "TokenRecording"]
