"""``exchange="secagg"``: the pairwise-masked secure sum (Bonawitz et al., CCS 2017) of the agreed
penalty schedule, in one process (:class:`SecAggExchange`) and as a server's secure aggregation
(:class:`SecAggAggregator`, ``make_aggregator("secagg", K)``).

Layout: :mod:`.plan` (who masks against whom), :mod:`.party` (a party's keys and seeds),
:mod:`.prg` (AES-128-CTR masks), :mod:`.network` (the seed agreement and the masked rounds in one
process), :mod:`.ledger` (the costs), :mod:`.exchange`, :mod:`.aggregation`. This package imports
:mod:`cryptography`; the factories import it lazily.
"""
from .exchange import SecAggExchange, check_equal_weights, unequal_weights_message
from .ledger import ROUND_KEYS, SETUP_KEYS, SecAggLedger
from .network import DroppedNeighbourError, SecAggNetwork, WireMessage
from .party import KeyAgreementError, Party, SignedKey
from .plan import SecAggPlan

__all__ = ["SecAggExchange", "SecAggLedger", "SecAggNetwork", "SecAggPlan", "Party", "SignedKey", "WireMessage",
           "DroppedNeighbourError", "KeyAgreementError", "ROUND_KEYS", "SETUP_KEYS", "check_equal_weights",
           "unequal_weights_message"]
