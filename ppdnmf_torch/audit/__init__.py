"""Privacy audit of the secure exchange: what an eavesdropper and a curious neighbour learn.

Two adversaries are measured, per agent (docs/THREAT_MODEL.md discusses the results):

**(a) An eavesdropper on every link.** With ``exchange="plain"`` the protocol sends
``U_i`` (and ``g_{i->j}``) in the clear to every neighbour; :func:`plain_transcript`
models that, and :func:`eavesdrop_plain` reads every ``U_j`` back from it, exactly. With
``exchange="paillier"`` the wire carries ciphertexts and public keys only:
:func:`protocol_plaintexts` collects every integer plaintext the protocol handled in
the same run (``q_i``, ``-q_i``, the penalties ``gamma``, ``gamma_ij gamma_ji``, every
reply ``gamma_ji (q_j - q_i)``, every partial and final sum ``S_int``, ``rho_int``, ...)
and :func:`scan_transcript` checks that none of them appears among the transcript's
integers, in any of the forms an implementation could leak it (the signed value, its
residue mod every agent's ``n`` and mod ``n^2``); it also checks that no ciphertext
is unobfuscated (``c = 1 + m n mod n^2``, i.e. ``c mod n == 1``) and that no ciphertext
repeats outside one broadcast (a deterministic or randomness-reusing encryption would
show equal plaintexts as equal ciphertexts).

Fair criterion. Every ciphertext is an element of ``Z*_{n^2}`` (about ``2 key_bits``
bits) and the only other transcript integers are the moduli ``n``; a plaintext form is
a specific integer, so a chance match has probability about ``2^-(2 key_bits - 2)``
per (transcript integer, form) pair. The scan therefore checks *all* plaintexts,
small ones included (no threshold is needed to avoid false alarms); the report still
counts how many of them are "significant" (``|v| > 2^16``, values that could not
plausibly be guessed) and prints the union bound on a chance match.

**(b) An honest-but-curious agent ``i``** that follows the protocol and reconstructs
each neighbour's ``U_j`` from everything it receives over the whole run. The attacks run
on a recording of the integer protocol (a ``quantized`` exchange with the :class:`Recorder` mixin, bit-identical
to ``paillier``); what ``i`` sees per ADMM iteration ``m``:

* ``protocol="paper"``: ``d_ij = gamma_ji (q_j - q_i)`` for every neighbour (decrypted),
  its own ``q_i`` and ``gamma_ij``, and ``rho_int_i = sum_j gamma_ij gamma_ji`` (handed
  by the simulation). Attacks (:func:`paper_attacks`):

  - ``rho_split``: ``gamma_ji ~ rho_int_i / sum_k gamma_ik`` (all neighbours' penalties
    assumed equal), ``U_j ~ (q_i + d_ij / gamma_ji) / n_max``. Exact for a single
    neighbour, and whenever the neighbours' integer penalties are equal (the paper uses
    one cap ``g_i = 0.033`` for every agent, and the draws saturate at the cap).
  - ``smooth_ls``: no integers, no ``rho``: all entries of ``d_ij`` share one scale, so
    ``q_j - q_i`` is known up to one scalar; with the penalty saturated at its cap the
    scalar is constant, and it is fitted by least squares assuming ``U_j`` moves less
    than ``U_i`` between consecutive ADMM iterations
    (``min_a sum_m ||a (d^(m) - d^(m-1)) + (q_i^(m) - q_i^(m-1))||^2``). Its estimate lies
    on the segment from ``U_i`` to ``U_j`` (the direction is exact) at a fraction ``c_ij``
    of the way, and for the two ends of an edge ``c_ij + c_ji = 1`` exactly (each end
    assumes the other one static), so over pairs its median error is about half the
    baseline's: what a real-valued attacker gets from the direction alone.
  - ``gcd``: ``d_ij`` is an integer vector that the integer ``gamma_ji`` divides, so
    ``gcd(d_ij) = gamma_ji gcd(q_j - q_i)``, and ``gcd(q_j - q_i) = 1`` for all but
    degenerate differences; a gcd that is a multiple of ``gamma_ji`` is corrected with
    the schedule (``gamma_ji`` is non-decreasing, so it is at most every later gcd).
    Then ``q_j = q_i + d_ij / gamma_ji`` exactly.

  The direction of ``U_j - U_i`` is exact whatever the scale: the report gives the
  correlation of ``d_ij`` with ``U_j - U_i``.
* ``protocol="aggregated"``: every reply ``i`` receives is encrypted under ``i``'s *own*
  public key, and ``i`` holds the private key. Two views are audited:

  - **honest-but-curious** (the usual model: ``i`` follows the protocol but computes what
    it likes on what it receives). Attack ``decrypt_each``: ``i`` decrypts each
    neighbour's individual replies before multiplying them into the sums: ``E_i(gamma_ji)``
    from the penalty round (step 1) gives ``gamma_ji``, ``E_i(gamma_ji (q_j - q_i))`` from
    step 5 gives ``d_ij = gamma_ji (q_j - q_i)``, and ``q_j = q_i + d_ij / gamma_ji`` exactly
    (whenever ``gamma_ji != 0``; a zero penalty makes the reply zero and carries nothing).
    The plaintexts are computed from the recording (:attr:`Recording.penalty_replies`,
    :attr:`Recording.replies`): decrypting under ``i``'s key yields exactly these integers,
    which :func:`decrypt_individual_replies` checks on a real Paillier transcript with the
    agents' private keys. So ``aggregated`` protects ``U_j`` from a curious neighbour no
    better than ``paper``.
  - **sums only** (``i`` decrypts only what the protocol tells it to: ``S_int_i = sum_j
    gamma_ij gamma_ji (q_j - q_i)`` and ``rho_int_i``; a "semi-honest but non-inspecting"
    agent). Attack ``nbr_mean``: ``(S_int_i + rho_int_i q_i) / rho_int_i`` is the
    penalty-weighted mean of the neighbours' ``q_j``, taken as the guess for each of them;
    with one neighbour it *is* ``q_j`` (exact recovery). Reported per pair under
    ``"sums_only"`` (:data:`SUMS_ONLY_ATTACKS`), next to the honest-but-curious result.

* ``protocol="masked"`` (the default; :mod:`.masked`): every reply is under ``i``'s key, but
  masked by units that cancel only in ``i``'s product, so each one decrypts on its own to a
  uniformly random value and ``i`` learns ``A_i = sum_j rho_ij q_j`` and ``rho_int_i`` only.
  Attacks on the whole run's sums (:data:`~.masked.MASKED_ATTACKS`): ``nbr_mean`` (the
  penalty-weighted neighbour mean; exact for a single neighbour, the inherent case) and
  ``trajectory`` (degree-2 receivers: the split between the two neighbours fitted across ADMM
  iterations). :func:`collusion_audit`: two neighbours ``i``, ``k`` of ``j`` pooling sums, terms
  and seeds. On a real Paillier run (:func:`masked_ciphertext_audit`, keys made and seeds
  watched by the audit, :func:`record_seeds`): every reply decrypted on its own (uniformity,
  correlation with ``q_j`` with a 99.9% bound, plaintext matches, ``decrypt_each``), a
  neighbour listening on a link it is not on, and colluders with their seeds; the transcript
  scan also looks for every seed.

The report's ``best_attack`` of a pair (per view) is the attack with the most exact recoveries, then
the lowest median error: an oracle choice among the attacks (for ``gcd`` the attacker can
check its own result: the division ``d_ij / gamma`` must be exact), so it bounds what
this set of attacks achieves. Every attack is compared with the trivial baseline
``U_j ~ U_i``: at consensus all ``U_j`` agree, and the consensus is the run's legitimate
output, so only error below the baseline's is leakage beyond the output. Errors are measured on the informative
iterations (``q_j != q_i``; in BCD iteration 1 every ``U`` equals its all-ones start).

**(c) The sums themselves** (:mod:`.sums`): whatever the protocol, ``i`` ends each call with
``rho_int_i = sum_j gamma_ij gamma_ji`` and ``S_int_i = sum_j gamma_ij gamma_ji (q_j - q_i)``.
:func:`sums_audit` attacks them with only what ``i`` holds: the integer decomposition of a
degree-2 receiver's sums (Diophantine solutions of ``rho_int_i`` in the public range, then the
smallest split of every entry of ``S_int_i``) and a lattice reduction (LLL) for degree >= 3;
it counts every exact recovery, the recoveries the attacker certifies itself and their false
positives, and partial leakage. :func:`schedule_audit`: what the changes of ``rho_int_i``
reveal of the neighbours' penalties.

**(d) The secure aggregation's server** (:mod:`.server`): a curious server, alone and with one
colluding worker, against each worker's single upload to
:func:`~ppdnmf_torch.exchange.aggregation.make_aggregator` (:func:`run_server_audit`).

**(e) ``exchange="secagg"``** (:mod:`.secagg`): every masked message of a recorded run against an
eavesdropper (uniformity, correlation, plaintexts, the sum of a receiver's messages), the receiver
that removes its edge mask, a neighbour listening on a link with its pair seed, and colluders
(:func:`secagg_message_audit`, the seeds watched by :func:`record_secagg_seeds`); the attacks of (b)
and (c) run on its recording as on the others.

**(f) Across calls** (:mod:`.across_calls`): a receiver that differences its sums from one call to
the next reads a neighbour's exact increment whenever that neighbour is the only one of its
neighbours whose value changed (the others frozen by the stopping rule, or constant):
:func:`difference_attack` counts them.

Entry point: :func:`ppdnmf_torch.models.ppdnmf.audit.run_audit` (``scripts/privacy_audit.py`` is its command line).

Modules: :mod:`.recording` (the recording exchanges, :class:`Recording`), :mod:`.secagg` (e),
:mod:`.across_calls` (f),
:mod:`.eavesdropper` (a), :mod:`.neighbour` (b), :mod:`.masked` (the masked protocol: its
attacks, collusion, real ciphertexts, seeds), :mod:`.report` (thresholds, verdicts, flags,
Markdown), :mod:`.sums` (c), :mod:`.server` (d). Recording a PPDNMF run (:func:`~ppdnmf_torch.models.ppdnmf.audit.record_fit`), the
named scenarios (:func:`~ppdnmf_torch.models.ppdnmf.audit.run_audit`) and the incremental
X-step's audit are PPDNMF's: :mod:`ppdnmf_torch.models.ppdnmf.audit`.
"""
from .across_calls import across_calls_flags, difference_attack, md_across_calls, neighbour_sums
from .eavesdropper import (
    SIGNIFICANT,
    eavesdrop_plain,
    eavesdropper_paillier,
    eavesdropper_plain,
    plain_transcript,
    protocol_plaintexts,
    scan_transcript,
)
from .masked import (
    CONFIDENCE_Z,
    MASKED_ATTACKS,
    collusion_audit,
    masked_attacks,
    masked_ciphertext_audit,
    record_seeds,
    tag_seeds,
)
from .neighbour import (
    ATTACKS,
    SUMS_ONLY_ATTACKS,
    aggregated_attacks,
    decrypt_each_check,
    decrypt_individual_replies,
    neighbour_audit,
    paper_attacks,
)
from .recording import (
    Recording,
    Recorder,
    make_recording_exchange,
)
from .report import BEATS_BASELINE_RATIO, DIRECTION_CORR, EXACT_FRACTION, format_markdown
from .attacks import attack_degree2, attack_lattice, certify, diophantine2
from .sums import public_x_max, schedule_audit, sums_audit
from .secagg import md_secagg, record_secagg_seeds, secagg_flags, secagg_message_audit
from .server import format_server_audit, run_server_audit, server_views

__all__ = [
    "Recording",
    "Recorder",
    "make_recording_exchange",
    "plain_transcript",
    "eavesdrop_plain",
    "eavesdropper_plain",
    "protocol_plaintexts",
    "scan_transcript",
    "eavesdropper_paillier",
    "paper_attacks",
    "aggregated_attacks",
    "decrypt_individual_replies",
    "decrypt_each_check",
    "neighbour_audit",
    "masked_attacks",
    "collusion_audit",
    "masked_ciphertext_audit",
    "record_seeds",
    "tag_seeds",
    "MASKED_ATTACKS",
    "CONFIDENCE_Z",
    "format_markdown",
    "attack_degree2",
    "attack_lattice",
    "certify",
    "diophantine2",
    "public_x_max",
    "sums_audit",
    "schedule_audit",
    "ATTACKS",
    "SUMS_ONLY_ATTACKS",
    "SIGNIFICANT",
    "EXACT_FRACTION",
    "BEATS_BASELINE_RATIO",
    "DIRECTION_CORR",
    "server_views",
    "run_server_audit",
    "format_server_audit",
    "difference_attack",
    "neighbour_sums",
    "across_calls_flags",
    "md_across_calls",
    "record_secagg_seeds",
    "secagg_message_audit",
    "secagg_flags",
    "md_secagg",
]
