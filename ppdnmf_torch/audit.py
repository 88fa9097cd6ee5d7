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
on a recording of the integer protocol (:class:`RecordingQuantizedExchange`, bit-identical
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

The report's ``best_attack`` of a pair (per view) is the attack with the most exact recoveries, then
the lowest median error: an oracle choice among the attacks (for ``gcd`` the attacker can
check its own result: the division ``d_ij / gamma`` must be exact), so it bounds what
this set of attacks achieves. Every attack is compared with the trivial baseline
``U_j ~ U_i``: at consensus all ``U_j`` agree, and the consensus is the run's legitimate
output, so only error below the baseline's is leakage beyond the output. Errors are measured on the informative
iterations (``q_j != q_i``; in BCD iteration 1 every ``U`` equals its all-ones start).

Entry point: :func:`run_audit` (``scripts/privacy_audit.py`` is its command line).
"""
from __future__ import annotations

import functools
import math
import platform
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ._utils import ConfigError
from .exchange.base import Exchange
from .exchange.codec import IntegerCodec
from .exchange.plain import PlainExchange
from .exchange.quantized import QuantizedExchange, encode_inputs

__all__ = [
    "Recording",
    "RecordingPlainExchange",
    "RecordingQuantizedExchange",
    "recording_paillier_class",
    "make_recording_exchange",
    "record_fit",
    "plain_transcript",
    "eavesdrop_plain",
    "protocol_plaintexts",
    "scan_transcript",
    "eavesdropper_paillier",
    "paper_attacks",
    "aggregated_attacks",
    "decrypt_individual_replies",
    "decrypt_each_check",
    "neighbour_audit",
    "run_audit",
    "format_markdown",
    "SCENARIOS",
    "ATTACKS",
    "SUMS_ONLY_ATTACKS",
    "SIGNIFICANT",
]

#: plaintexts above this magnitude count as "significant" in the eavesdropper scan
SIGNIFICANT = 1 << 16
#: a pair is flagged ``exact_recovery`` when the best attack recovers ``q_j`` bit for bit
#: at least this fraction of the informative iterations
EXACT_FRACTION = 0.5
#: a pair is flagged ``beats_baseline`` when the best attack's median relative error is at
#: most this fraction of the trivial baseline's
BEATS_BASELINE_RATIO = 0.5
#: ``difference_direction_exact`` when every informative message correlates this well
#: with ``U_j - U_i``
DIRECTION_CORR = 0.999

#: attacks per protocol (``baseline`` first): what an honest-but-curious agent can run
ATTACKS = {
    "paper": ("baseline", "gcd", "rho_split", "smooth_ls"),
    "aggregated": ("baseline", "decrypt_each", "nbr_mean"),
}
#: the attacks open to an agent that decrypts only what the protocol tells it to (under
#: ``aggregated``: the two sums); reported as the pair's ``"sums_only"`` view
SUMS_ONLY_ATTACKS = {"aggregated": ("nbr_mean",)}

#: the scenarios :func:`run_audit` knows by name
SCENARIOS = ("paper_synthetic", "star", "random_caps", "short_admm")


# ---------------------------------------------------------------------------------------
# Recording what goes through the exchange
# ---------------------------------------------------------------------------------------
class _Recorder:
    """Mixin: keeps a copy of what every ``exchange()`` call handled (step 5's inputs)."""

    def _init_records(self) -> None:
        self.records: list = []

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        out = super().exchange(U, g, bcd_iter=bcd_iter, admm_iter=admm_iter, out=out)
        rec = {"bcd": int(bcd_iter), "admm": int(admm_iter),
               "U": U.detach().to("cpu", torch.float64).clone(), "g": g.detach().to("cpu", torch.float64).clone()}
        codec = getattr(self, "codec", None)
        if codec is not None:
            q, gamma, _ = encode_inputs(codec, self.topology, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
            rec["q"] = q.cpu().clone()
            rec["gamma"] = gamma.cpu().clone()
        self.records.append(rec)
        return out


class RecordingPlainExchange(_Recorder, PlainExchange):
    """``plain`` exchange that records ``U`` and ``g`` of every call (``.records``)."""

    def __init__(self):
        super().__init__()
        self._init_records()


class RecordingQuantizedExchange(_Recorder, QuantizedExchange):
    """``quantized`` exchange that records ``U``, ``g``, ``q`` and ``gamma`` of every call."""

    def __init__(self, codec: IntegerCodec, *, protocol: str = "aggregated", cost_model=False):
        super().__init__(codec, protocol=protocol, cost_model=cost_model)
        self._init_records()


@functools.lru_cache(maxsize=1)
def recording_paillier_class():
    """The recording subclass of :class:`~ppdnmf_torch.exchange.paillier.PaillierExchange`
    (created on first use, so that importing this module does not import :mod:`phe`).

    It records like :class:`RecordingQuantizedExchange`, keeps the agents' public moduli
    (``.moduli``, public information) and always records the transcript.
    """
    from .exchange.paillier import PaillierExchange

    class RecordingPaillierExchange(_Recorder, PaillierExchange):
        def __init__(self, codec, *, protocol="aggregated", keypairs=None, cost_model=False, **options):
            super().__init__(codec, protocol=protocol, keypairs=keypairs, cost_model=cost_model,
                             record_transcript=True, **options)
            self._init_records()
            self.moduli: list = []

        def bind(self, topology, *, dtype, device, fuse=False):
            super().bind(topology, dtype=dtype, device=device, fuse=fuse)
            self.moduli = [int(a.public_key.n) for a in self.agents]

    return RecordingPaillierExchange


def make_recording_exchange(kind="quantized", *, protocol="aggregated", n_max=1e6, g_bits=16, key_bits=128,
                            keypairs=None, paillier_options=None) -> Exchange:
    """A recording exchange of ``kind`` in {"plain", "quantized", "paillier"}.

    ``paillier_options``: further keywords of
    :class:`~ppdnmf_torch.exchange.paillier.PaillierExchange` (e.g. ``workers``, ``packing``).
    """
    if kind == "plain":
        return RecordingPlainExchange()
    codec = IntegerCodec(n_max=n_max, g_bits=g_bits, key_bits=key_bits)
    if kind == "quantized":
        return RecordingQuantizedExchange(codec, protocol=protocol)
    if kind == "paillier":
        import warnings

        from .exchange.paillier import InsecureKeyWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InsecureKeyWarning)  # small keys are the audit's point
            return recording_paillier_class()(codec, protocol=protocol, keypairs=keypairs,
                                              **(paillier_options or {}))
    raise ConfigError(f"kind: unknown exchange kind {kind!r}; use 'plain', 'quantized' or 'paillier'")


@dataclass
class Recording:
    """Everything step 5 handled in one run, stacked over the ``T`` exchange calls.

    Attributes
    ----------
    graph : Graph
    kind, protocol : str
    n_max : float
    g_bits : int
    bcd, admm : ndarray (T,) int
        1-based BCD and ADMM iteration of every call.
    U : ndarray (T, N, P) float64
        The ``U_i`` (flattened ``L x K``) that went into the exchange.
    g : ndarray (T, 2E) float64
        Penalty draws per directed edge (CSR order).
    q : ndarray (T, N, P) int64 or None
        ``round(n_max U)`` (integer kinds).
    gamma : ndarray (T, 2E) int64 or None
        ``round(2^s g)`` (integer kinds).
    src, dst, rev : ndarray (2E,) int64
    moduli : list of int
        The agents' public moduli (``paillier`` only).
    transcript : list
        Wire messages (``paillier``: :class:`~ppdnmf_torch.exchange.paillier.WireMessage`).
    layout : optional
        The Paillier exchange's slot layout when it packs several values per plaintext.
    nmse, consensus : float
        Of the run's last BCD iteration.
    """

    graph: object
    kind: str
    protocol: str
    n_max: float
    g_bits: int
    bcd: np.ndarray
    admm: np.ndarray
    U: np.ndarray
    g: np.ndarray
    q: np.ndarray | None
    gamma: np.ndarray | None
    src: np.ndarray
    dst: np.ndarray
    rev: np.ndarray
    moduli: list = field(default_factory=list)
    transcript: list = field(default_factory=list)
    layout: object = None
    nmse: float = float("nan")
    consensus: float = float("nan")

    @property
    def n_agents(self) -> int:
        return int(self.U.shape[1])

    @property
    def n_calls(self) -> int:
        return int(self.U.shape[0])

    @property
    def degree(self) -> np.ndarray:
        return np.bincount(self.src, minlength=self.n_agents)

    def _need_ints(self):
        if self.q is None:
            raise ConfigError("this analysis needs an integer recording (exchange 'quantized' or 'paillier')")

    @property
    def w(self) -> np.ndarray:
        """``gamma_ij gamma_ji`` per call and directed edge ``(T, 2E)``."""
        self._need_ints()
        return self.gamma * self.gamma[:, self.rev]

    @property
    def rho_int(self) -> np.ndarray:
        """``rho_int_i = sum_j gamma_ij gamma_ji`` ``(T, N)``."""
        out = np.zeros((self.n_calls, self.n_agents), dtype=np.int64)
        np.add.at(out, (slice(None), self.src), self.w)
        return out

    @property
    def replies(self) -> np.ndarray:
        """``d_e = gamma_ji (q_j - q_i)`` for directed edge ``e = i -> j``: what ``i`` decrypts
        from ``j`` under ``protocol="paper"``, and what it gets by decrypting ``j``'s step-5
        reply on its own under ``protocol="aggregated"`` (the reply is under ``i``'s key),
        ``(T, 2E, P)`` int64."""
        self._need_ints()
        return self.gamma[:, self.rev, None] * (self.q[:, self.dst] - self.q[:, self.src])

    @property
    def penalty_replies(self) -> np.ndarray:
        """``gamma_ji`` for directed edge ``e = i -> j``: what ``i`` gets by decrypting ``j``'s
        reply ``E_i(gamma_ji)`` of the penalty round (``protocol="aggregated"``, step 1) on its
        own, ``(T, 2E)`` int64."""
        self._need_ints()
        return self.gamma[:, self.rev]

    @property
    def S_int(self) -> np.ndarray:
        """``S_int_i = sum_j gamma_ij gamma_ji (q_j - q_i)`` ``(T, N, P)``: what ``i`` decrypts
        under ``protocol="aggregated"``."""
        terms = self.gamma[:, :, None] * self.replies
        out = np.zeros(self.q.shape, dtype=np.int64)
        np.add.at(out, (slice(None), self.src), terms)
        return out


def _as_recording(exch, graph, kind, protocol, n_max, g_bits, result) -> Recording:
    recs = exch.records
    if not recs:
        raise ConfigError("the run made no exchange call (a single agent has nothing to exchange)")
    ints = "q" in recs[0]
    return Recording(
        graph=graph, kind=kind, protocol=protocol, n_max=float(n_max), g_bits=int(g_bits),
        bcd=np.array([r["bcd"] for r in recs], dtype=np.int64),
        admm=np.array([r["admm"] for r in recs], dtype=np.int64),
        U=torch.stack([r["U"] for r in recs]).numpy(),
        g=torch.stack([r["g"] for r in recs]).numpy(),
        q=torch.stack([r["q"] for r in recs]).numpy() if ints else None,
        gamma=torch.stack([r["gamma"] for r in recs]).numpy() if ints else None,
        src=graph.src.cpu().numpy().astype(np.int64), dst=graph.dst.cpu().numpy().astype(np.int64),
        rev=graph.rev.cpu().numpy().astype(np.int64),
        moduli=list(getattr(exch, "moduli", []) or []),
        transcript=list(result.costs.get("transcript", []) or []),
        layout=getattr(exch, "layout", None),
        nmse=float(result.nmse), consensus=float(result.consensus),
    )


def record_fit(blocks, graph, rank, *, kind="quantized", protocol="aggregated", n_max=1e6, g_bits=16,
               key_bits=128, keypairs=None, paillier_options=None, **fit_kwargs) -> Recording:
    """Run :func:`ppdnmf_torch.fit` through a recording exchange and return the :class:`Recording`.

    Parameters
    ----------
    blocks : list of N (L, M_i) blocks
    graph : Graph
    rank : int
    kind : {"plain", "quantized", "paillier"}
    protocol : {"aggregated", "paper"}
        Message pattern (``paillier``: what goes on the wire; the integers are the same).
    n_max, g_bits, key_bits
        The codec (``key_bits`` also sets the keys of ``paillier``; default 128 as in the paper).
    keypairs : optional
        Pre-made Paillier key pairs (tests).
    paillier_options : dict, optional
        Further options of the Paillier exchange (``workers``, ``packing``, ...).
    **fit_kwargs
        Any other keyword of :func:`~ppdnmf_torch.fit` (``bcd_iters``, ``g_max``, ...).
    """
    from .api import fit
    from .graph import Graph

    if not isinstance(graph, Graph):
        from .problem import as_graph

        graph = as_graph(graph)
    exch = make_recording_exchange(kind, protocol=protocol, n_max=n_max, g_bits=g_bits, key_bits=key_bits,
                                   keypairs=keypairs, paillier_options=paillier_options)
    fit_kwargs.setdefault("device", "cpu")
    result = fit(blocks, graph, rank, exchange=exch, **fit_kwargs)
    return _as_recording(exch, graph, kind, protocol, n_max, g_bits, result)


# ---------------------------------------------------------------------------------------
# (a) the eavesdropper
# ---------------------------------------------------------------------------------------
def plain_transcript(rec: Recording) -> list:
    """The wire of the plain protocol: every call, ``i -> j`` carries ``U_i`` and ``g_{i->j}``.

    ``exchange="plain"`` computes ``S_i`` in floating point from the neighbours' ``U_j``
    and penalties; deployed, that is one clear-text message per directed edge.
    """
    from .exchange.paillier import WireMessage  # the same record for every protocol

    out = []
    for t in range(rec.n_calls):
        b, m = int(rec.bcd[t]), int(rec.admm[t])
        for e, (i, j) in enumerate(zip(rec.src.tolist(), rec.dst.tolist())):
            out.append(WireMessage(b, m, i, j, "plain_u_and_penalty",
                                        tuple(rec.U[t, i].tolist()) + (float(rec.g[t, e]),)))
    return out


def eavesdrop_plain(transcript: list, n_agents: int, n_values: int) -> dict:
    """Read every agent's ``U`` per iteration off a plain transcript.

    Returns ``{(bcd, admm): ndarray (N, P)}`` (NaN rows for agents that sent nothing).
    """
    out: dict = {}
    for msg in transcript:
        key = (msg.bcd_iter, msg.admm_iter)
        if key not in out:
            out[key] = np.full((n_agents, n_values), np.nan)
        out[key][msg.sender] = np.asarray(msg.payload[:n_values], dtype=np.float64)
    return out


def _eavesdropper_plain_report(rec: Recording) -> dict:
    tr = plain_transcript(rec)
    P = rec.U.shape[2]
    seen = eavesdrop_plain(tr, rec.n_agents, P)
    agents = []
    for j in range(rec.n_agents):
        errs = []
        exact = 0
        for t in range(rec.n_calls):
            got = seen[(int(rec.bcd[t]), int(rec.admm[t]))][j]
            true = rec.U[t, j]
            if np.isnan(got).any():
                continue
            errs.append(float(np.linalg.norm(got - true) / max(np.linalg.norm(true), 1e-300)))
            exact += int(np.array_equal(got, true))
        n_sent = sum(1 for msg in tr if msg.sender == j)
        agents.append({
            "agent": j, "messages_sent": n_sent,
            "recovered_fraction": exact / rec.n_calls,
            "rel_err_max": max(errs) if errs else None,
            "flags": ["U_in_clear"] if exact else [],
        })
    return {"kind": "plain", "n_messages": len(tr), "agents": agents,
            "all_recovered_exactly": all(a["recovered_fraction"] == 1.0 for a in agents)}


def protocol_plaintexts(rec: Recording, layout=None) -> dict:
    """Every integer plaintext the integer protocol handled in the recorded run, by name.

    Names: ``q`` (``q_i``), ``neg_q`` (``-q_i``, encrypted by ``i``), ``gamma`` (every
    penalty), ``w`` (``gamma_ij gamma_ji``), ``diff`` (``q_j - q_i``, after the homomorphic
    addition), ``reply`` (``gamma_ji (q_j - q_i)``), ``scaled_reply`` (``gamma_ij`` times
    it), ``partial_S`` (the running sums over ``i``'s neighbours in CSR order, the last
    being ``S_int_i``), ``partial_rho`` (likewise for ``rho_int_i``). Each value is a
    Python ``int``; the sets may overlap (both protocols' values are included).

    With a packing ``layout`` (default: the recording's, when it has more than one slot per
    plaintext) the packed plaintexts of every vector above are added too, as
    ``packed_<name>`` (``layout.pack_signed``: the integers that get encrypted).
    """
    rec._need_ints()
    layout = layout if layout is not None else rec.layout
    q, gamma = rec.q, rec.gamma
    d = rec.replies
    terms = gamma[:, :, None] * d
    w = rec.w
    out = {
        "q": q.ravel(), "neg_q": (-q).ravel(), "gamma": gamma.ravel(), "w": w.ravel(),
        "diff": (q[:, rec.dst] - q[:, rec.src]).ravel(), "reply": d.ravel(), "scaled_reply": terms.ravel(),
    }
    # running sums over each agent's out-edges, in the order the protocol accumulates them
    ps, pr = [], []
    crow = np.concatenate([[0], np.cumsum(rec.degree)])
    for i in range(rec.n_agents):
        a, b = crow[i], crow[i + 1]
        if b > a:
            ps.append(np.cumsum(terms[:, a:b], axis=1).ravel())
            pr.append(np.cumsum(w[:, a:b], axis=1).ravel())
    out["partial_S"] = np.concatenate(ps) if ps else np.zeros(0, dtype=np.int64)
    out["partial_rho"] = np.concatenate(pr) if pr else np.zeros(0, dtype=np.int64)
    res = {k: sorted({int(v) for v in np.unique(arr)}) for k, arr in out.items()}
    if layout is not None and getattr(layout, "slots", 1) > 1:
        P = q.shape[-1]
        vectors = {  # name -> (..., P) arrays whose rows are packed as the protocol packs them
            "q": q, "neg_q": -q, "diff": q[:, rec.dst] - q[:, rec.src], "reply": d, "scaled_reply": terms,
            "partial_S": np.concatenate([np.cumsum(terms[:, crow[i]:crow[i + 1]], axis=1)
                                         for i in range(rec.n_agents) if crow[i + 1] > crow[i]], axis=1)
            if len(rec.src) else np.zeros((0, P), dtype=np.int64),
        }
        for name, arr in vectors.items():
            packed = set()
            for row in arr.reshape(-1, P):
                packed.update(int(m) for m in layout.pack_signed(row.tolist()))
            res[f"packed_{name}"] = sorted(packed)
    return res


# which agent's key a message's ciphertexts are under
_KEY_OF = {"enc_neg_u": "sender", "enc_neg_u_and_key": "sender", "enc_reply": "receiver",
           "enc_penalty": "receiver"}


def _ciphertexts(msg) -> list:
    """The ciphertexts of a wire message (the trailing public key of ``enc_neg_u_and_key`` excluded)."""
    if msg.kind == "public_key":
        return []
    if msg.kind == "enc_neg_u_and_key":
        return list(msg.payload[:-1])
    return list(msg.payload)


def scan_transcript(transcript: list, plaintexts, moduli: list, *, significant: int = SIGNIFICANT) -> dict:
    """Look for plaintexts, unobfuscated and repeated ciphertexts in a Paillier transcript.

    Parameters
    ----------
    transcript : list of WireMessage
    plaintexts : iterable of int, or dict name -> iterable of int
        Signed plaintext integers (:func:`protocol_plaintexts`).
    moduli : list of int
        Every agent's public ``n`` (node order).
    significant : int
        Plaintexts with ``|v| > significant`` are counted separately in the report.

    Returns
    -------
    dict
        ``hits`` (list of ``{"value", "form", "name", "bcd_iter", "admm_iter", "sender",
        "receiver", "kind"}``, at most 20), ``n_hits``, ``unobfuscated`` (ciphertexts with
        ``c mod n == 1`` under their key), ``repeated_ciphertexts`` (a ciphertext seen in two
        different broadcasts), ``n_plaintexts``, ``n_significant``, ``n_forms``,
        ``n_payload_integers``, ``chance_match_bound`` and ``per_sender`` counts.
    """
    if isinstance(plaintexts, dict):
        named = [(name, v) for name, vals in plaintexts.items() for v in vals]
    else:
        named = [("value", v) for v in plaintexts]
    forms: dict = {}
    for name, v in named:
        v = int(v)
        forms.setdefault(v, (v, "value", name))
        for k, n in enumerate(moduli):
            forms.setdefault(v % n, (v, f"mod n_{k}", name))
            forms.setdefault(v % (n * n), (v, f"mod n_{k}^2", name))
    values = {int(v) for _, v in named}
    hits, unobf, repeats = [], 0, 0
    seen_ct: dict = {}
    per_sender: dict = {}
    n_payload = 0
    for idx, msg in enumerate(transcript):
        ps = per_sender.setdefault(int(msg.sender), {"messages": 0, "ciphertexts": 0, "plaintext_hits": 0,
                                                     "unobfuscated": 0})
        ps["messages"] += 1
        cts = _ciphertexts(msg)
        ps["ciphertexts"] += len(cts)
        n_payload += len(msg.payload)
        for x in msg.payload:
            x = int(x)
            if x in forms:
                v, form, name = forms[x]
                ps["plaintext_hits"] += 1
                if len(hits) < 20:
                    hits.append({"value": v, "form": form, "name": name, "bcd_iter": msg.bcd_iter,
                                 "admm_iter": msg.admm_iter, "sender": msg.sender, "receiver": msg.receiver,
                                 "kind": msg.kind})
                else:
                    hits.append(None)
        owner = _KEY_OF.get(msg.kind)
        if owner is not None and moduli:
            n = moduli[getattr(msg, owner)]
            bad = sum(1 for c in cts if int(c) % n == 1)
            unobf += bad
            ps["unobfuscated"] += bad
        # one broadcast (the same request to every neighbour) is one message as far as
        # freshness goes
        bkey = (msg.bcd_iter, msg.admm_iter, msg.sender, msg.kind, hash(msg.payload))
        for c in cts:
            prev = seen_ct.setdefault(int(c), bkey)
            if prev != bkey:
                repeats += 1
    n_hits = len(hits)
    bound = None
    if moduli:
        smallest = min(moduli)
        # every payload integer vs every form: a uniform element of Z_{n^2} matches a given
        # integer with probability <= 1 / phi(n^2) ~ 1 / n^2
        bound = float(n_payload) * float(len(forms)) / float(smallest) ** 2
    return {
        "hits": [h for h in hits if h is not None],
        "n_hits": n_hits,
        "unobfuscated": unobf,
        "repeated_ciphertexts": repeats,
        "n_plaintexts": len(values),
        "n_significant": sum(1 for v in values if abs(v) > significant),
        "significant_threshold": significant,
        "n_forms": len(forms),
        "n_messages": len(transcript),
        "n_payload_integers": n_payload,
        "chance_match_bound": bound,
        "per_sender": per_sender,
        "clean": n_hits == 0 and unobf == 0 and repeats == 0,
    }


def eavesdropper_paillier(rec: Recording) -> dict:
    """Scan a recorded ``paillier`` run's transcript for its own plaintexts (per agent)."""
    if rec.kind != "paillier":
        raise ConfigError("eavesdropper_paillier: needs a recording of exchange='paillier'")
    plain = protocol_plaintexts(rec)
    scan = scan_transcript(rec.transcript, plain, rec.moduli)
    slots = getattr(rec.layout, "slots", 1) if rec.layout is not None else 1
    values = {v for k, vals in plain.items() if not k.startswith("packed_") for v in vals}
    packed = {v for k, vals in plain.items() if k.startswith("packed_") for v in vals}
    scan["n_values"] = len(values)
    scan["n_values_significant"] = sum(1 for v in values if abs(v) > SIGNIFICANT)
    scan["n_packed"] = len(packed)
    agents = []
    for j in range(rec.n_agents):
        ps = scan["per_sender"].get(j, {"messages": 0, "ciphertexts": 0, "plaintext_hits": 0, "unobfuscated": 0})
        flags = []
        if ps["plaintext_hits"]:
            flags.append("plaintext_on_wire")
        if ps["unobfuscated"]:
            flags.append("unobfuscated_ciphertext")
        agents.append({"agent": j, "messages_sent": ps["messages"], "ciphertexts_sent": ps["ciphertexts"],
                       "plaintext_hits": ps["plaintext_hits"], "unobfuscated": ps["unobfuscated"], "flags": flags})
    scan = {k: v for k, v in scan.items() if k != "per_sender"}
    return {"kind": "paillier", "protocol": rec.protocol, "key_bits": min(m.bit_length() for m in rec.moduli),
            "slots_per_plaintext": int(slots), "n_calls": rec.n_calls, "scan": scan, "agents": agents}


# ---------------------------------------------------------------------------------------
# (b) the honest-but-curious neighbour
# ---------------------------------------------------------------------------------------
def _gcd_scales(d: np.ndarray) -> np.ndarray:
    """Per call and edge, the gcd attack's estimate of ``gamma_ji`` from ``d (T, 2E, P)``.

    ``gcd(d) = gamma_ji * gcd(q_j - q_i)``; a gcd above a later one (the true penalty is
    non-decreasing, so it is at most every later gcd) is cut to its largest divisor that
    fits. 0 where the message is all zeros (nothing to learn from it).
    """
    G = np.gcd.reduce(np.abs(d), axis=-1)  # (T, 2E)
    est = G.copy()
    T = G.shape[0]
    big = np.iinfo(np.int64).max
    suffix = np.full(G.shape[1], big, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        for e in np.nonzero((G[t] > suffix) & (G[t] > 0))[0]:
            g, cap = int(G[t, e]), int(suffix[e])
            est[t, e] = max((k for k in _divisors(g) if k <= cap), default=0)
        pos = G[t] > 0
        suffix = np.where(pos, np.minimum(suffix, est[t]), suffix)
    return est


def _divisors(n: int) -> list:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in small]


def _smooth_scale(d: np.ndarray, qi: np.ndarray, bcd: np.ndarray, info: np.ndarray) -> np.ndarray:
    """``a = 1 / gamma_ji`` per edge: ``min_a sum_m ||a (d^m - d^(m-1)) + (q_i^m - q_i^(m-1))||^2``
    over consecutive informative calls of the same BCD iteration (``U_j`` assumed to move
    less than ``U_i``; one constant scale, the penalty having saturated at its cap)."""
    dd = np.diff(d.astype(np.float64), axis=0)  # (T-1, 2E, P)
    dq = np.diff(qi.astype(np.float64), axis=0)
    ok = (bcd[1:] == bcd[:-1])[:, None] & info[1:] & info[:-1]  # (T-1, 2E)
    num = -np.where(ok, (dd * dq).sum(-1), 0.0).sum(0)
    den = np.where(ok, (dd * dd).sum(-1), 0.0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = num / den
    return np.where(np.isfinite(a) & (a > 0), a, np.nan)


def paper_attacks(rec: Recording) -> dict:
    """Estimates ``U_hat (T, 2E, P)`` of ``U_j`` by agent ``i`` for every directed edge ``i -> j``,
    from what ``i`` sees under ``protocol="paper"``; keys :data:`ATTACKS`\\ ``["paper"]``."""
    rec._need_ints()
    n_max = rec.n_max
    qi = rec.q[:, rec.src]  # (T, 2E, P), the attacker's own
    d = rec.replies
    out = {"baseline": rec.U[:, rec.src]}
    # rho_split: gamma_ji ~ rho_int_i / sum_k gamma_ik
    own = np.zeros((rec.n_calls, rec.n_agents), dtype=np.int64)
    np.add.at(own, (slice(None), rec.src), rec.gamma)
    own_e = own[:, rec.src].astype(np.float64)
    rho_e = rec.rho_int[:, rec.src].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(own_e > 0, rho_e / own_e, 0.0)
        out["rho_split"] = np.where(scale[..., None] > 0, (qi + d / np.where(scale > 0, scale, 1.0)[..., None]),
                                    qi) / n_max
    info = (d != 0).any(-1)
    a = _smooth_scale(d, qi, rec.bcd, info)  # (2E,)
    a = np.where(np.isnan(a), 0.0, a)
    out["smooth_ls"] = (qi + a[None, :, None] * d) / n_max
    gam = _gcd_scales(d)
    exact = np.where(gam[..., None] > 0, d // np.where(gam > 0, gam, 1)[..., None], 0)
    out["gcd"] = (qi + exact) / n_max
    return out


def aggregated_attacks(rec: Recording) -> dict:
    """Estimates ``U_hat (T, 2E, P)`` of ``U_j`` by ``i`` under ``protocol="aggregated"``;
    keys :data:`ATTACKS`\\ ``["aggregated"]``.

    ``decrypt_each`` (honest-but-curious): ``i`` decrypts each reply under its own key,
    ``gamma_ji`` (step 1) and ``d_ij = gamma_ji (q_j - q_i)`` (step 5), and divides:
    ``q_j = q_i + d_ij / gamma_ji``, exact (``gamma_ji`` divides ``d_ij``); where
    ``gamma_ji = 0`` the reply is zero and the guess stays ``q_i``.
    ``nbr_mean`` (sums only): the penalty-weighted neighbourhood mean from ``S_int_i`` and
    ``rho_int_i``.
    """
    rec._need_ints()
    S = rec.S_int[:, rec.src]  # (T, 2E, P): i's view, repeated for each of its neighbours
    rho = rec.rho_int[:, rec.src][..., None]
    qi = rec.q[:, rec.src]
    with np.errstate(invalid="ignore", divide="ignore"):
        # (S + rho q_i) / rho, computed as q_i + S / rho to stay far from int64 limits
        exact = (S % np.where(rho > 0, rho, 1) == 0)
        mean = np.where(exact, qi + S // np.where(rho > 0, rho, 1), qi + S / np.where(rho > 0, rho, 1))
    gam = rec.penalty_replies  # (T, 2E): E_i(gamma_ji) decrypted
    d = rec.replies  # (T, 2E, P): E_i(gamma_ji (q_j - q_i)) decrypted
    pos = gam > 0
    each = np.where(pos[..., None], qi + d // np.where(pos, gam, 1)[..., None], qi)
    return {"baseline": rec.U[:, rec.src], "decrypt_each": each / rec.n_max,
            "nbr_mean": np.where(rho > 0, mean, qi) / rec.n_max}


def _signed(residue: int, n: int) -> int:
    """The signed integer a residue mod ``n`` stands for (negatives are encrypted as ``v + n``)."""
    r = int(residue) % n
    return r - n if r > n // 2 else r


def decrypt_individual_replies(rec: Recording, private_keys) -> dict:
    """Decrypt every reply of a recorded ``paillier`` run on its own, as its receiver can.

    Every ``enc_penalty`` (step 1, ``E_i(gamma_ji)``) and ``enc_reply`` (step 5,
    ``E_i(gamma_ji (q_j - q_i))``) that neighbour ``j`` sends to ``i`` is under ``i``'s public
    key; ``i`` holds the private key, so nothing stops it from decrypting each one before
    it multiplies them into the sums. This function does exactly that with the agents'
    private keys (a test or an audit that made the keys; :func:`record_fit` with
    ``keypairs``), unpacking packed plaintexts with the recording's slot layout.

    Parameters
    ----------
    rec : Recording
        Of ``kind="paillier"`` (the transcript is recorded).
    private_keys : sequence
        One per node, in node order: ``phe`` private keys or ``(public, private)`` pairs.

    Returns
    -------
    dict
        ``penalty`` ``(T, 2E)`` int64 and ``reply`` ``(T, 2E, P)`` int64: the plaintexts per
        recorded call and directed edge ``i -> j`` (what ``i`` decrypted from ``j``; 0 where
        nothing was received), ``penalty_seen`` / ``reply_seen`` ``(T, 2E)`` bool (a message
        was decrypted there), ``n_penalty_messages``, ``n_reply_messages`` and
        ``n_ciphertexts`` decrypted. Under ``protocol="aggregated"`` these equal
        :attr:`Recording.penalty_replies` and :attr:`Recording.replies`.
    """
    if rec.kind != "paillier":
        raise ConfigError("decrypt_individual_replies: needs a recording of exchange='paillier'")
    rec._need_ints()
    by_n = {}
    for k in private_keys:
        sk = k[1] if isinstance(k, (tuple, list)) else k
        by_n[int(sk.public_key.n)] = sk
    missing = [i for i, n in enumerate(rec.moduli) if int(n) not in by_n]
    if missing:
        raise ConfigError(f"decrypt_individual_replies: no private key for nodes {missing}")
    T, P = rec.n_calls, rec.q.shape[-1]
    call = {(int(b), int(a)): t for t, (b, a) in enumerate(zip(rec.bcd, rec.admm))}
    edge = {(int(i), int(j)): e for e, (i, j) in enumerate(zip(rec.src, rec.dst))}
    E = len(rec.src)
    penalty = np.zeros((T, E), dtype=np.int64)
    reply = np.zeros((T, E, P), dtype=np.int64)
    pen_seen = np.zeros((T, E), dtype=bool)
    rep_seen = np.zeros((T, E), dtype=bool)
    n_pen = n_rep = n_ct = 0
    layout = rec.layout
    for msg in rec.transcript:
        if msg.kind not in ("enc_penalty", "enc_reply"):
            continue
        t = call.get((int(msg.bcd_iter), int(msg.admm_iter)))
        if t is None:
            continue
        i, j = int(msg.receiver), int(msg.sender)  # j's reply to i, under i's key
        e = edge[(i, j)]
        n = int(rec.moduli[i])
        sk = by_n[n]
        residues = [sk.raw_decrypt(int(c)) for c in msg.payload]
        n_ct += len(residues)
        if msg.kind == "enc_penalty":
            penalty[t, e] = _signed(residues[0], n)
            pen_seen[t, e] = True
            n_pen += 1
        else:
            if layout is not None:
                vals = layout.unpack(residues, n, P)
            else:
                vals = [_signed(r, n) for r in residues]
            reply[t, e] = vals
            rep_seen[t, e] = True
            n_rep += 1
    return {"penalty": penalty, "reply": reply, "penalty_seen": pen_seen, "reply_seen": rep_seen,
            "n_penalty_messages": n_pen, "n_reply_messages": n_rep, "n_ciphertexts": n_ct}


def _rowcorr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation along the last axis (NaN where either side is constant)."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(-1) / den, np.nan)


def _nanstat(fn, x):
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(fn(x)) if x.size else None


def _attack_metrics(U_hat, rec: Recording, info: np.ndarray, e: int) -> dict:
    """Metrics of one attack on one directed edge over the informative calls ``info (T,)``."""
    i, j = int(rec.src[e]), int(rec.dst[e])
    idx = np.nonzero(info)[0]
    Ut, Ui, Uh = rec.U[idx, j], rec.U[idx, i], U_hat[idx, e]
    rel = np.linalg.norm(Uh - Ut, axis=-1) / np.maximum(np.linalg.norm(Ut, axis=-1), 1e-300)
    pear = _rowcorr(Uh, Ut)
    dcor = _rowcorr(Uh - Ui, Ut - Ui)
    exact = np.all(np.rint(Uh * rec.n_max).astype(np.int64) == rec.q[idx, j], axis=-1)
    bcd = rec.bcd[idx]
    per_bcd = []
    for b in range(1, int(rec.bcd.max()) + 1):
        sel = bcd == b
        per_bcd.append(float(rel[sel].mean()) if sel.any() else None)
    first = next((v for v in per_bcd if v is not None), None)
    return {
        "rel_err_median": _nanstat(np.median, rel),
        "rel_err_mean": _nanstat(np.mean, rel),
        "rel_err_max": _nanstat(np.max, rel),
        "rel_err_early": first,
        "rel_err_final": float(rel[-1]) if rel.size else None,
        "pearson_median": _nanstat(np.median, pear),
        "diff_corr_median": _nanstat(np.median, dcor),
        "exact_fraction": float(exact.mean()) if exact.size else None,
        "per_bcd_rel_err": per_bcd,
    }


def neighbour_audit(rec: Recording, protocol: str) -> dict:
    """What every agent learns about each neighbour's ``U_j`` under ``protocol``.

    Returns a dict with ``pairs`` (one per directed edge ``attacker -> target``: every
    attack's metrics, the best attack, flags), ``agents`` (per agent: degree, neighbours,
    flags as attacker, ``exposed_to``), ``per_bcd`` (mean relative error of the baseline and
    of the best attack per BCD iteration, over pairs) and ``summary``.
    """
    if protocol not in ATTACKS:
        raise ConfigError(f"protocol: unknown protocol {protocol!r}; use one of {tuple(ATTACKS)}")
    rec._need_ints()
    est = paper_attacks(rec) if protocol == "paper" else aggregated_attacks(rec)
    sums_only = list(SUMS_ONLY_ATTACKS.get(protocol, ()))
    diff_q = rec.q[:, rec.dst] - rec.q[:, rec.src]
    info_all = (diff_q != 0).any(-1)  # (T, 2E)
    deg = rec.degree
    final_gamma = rec.gamma[-1]
    dcorr_msg = _rowcorr(rec.replies.astype(np.float64), rec.U[:, rec.dst] - rec.U[:, rec.src])
    qerr = np.linalg.norm(rec.q / rec.n_max - rec.U, axis=-1) / np.maximum(np.linalg.norm(rec.U, axis=-1), 1e-300)
    pairs = []
    for e in range(len(rec.src)):
        i, j = int(rec.src[e]), int(rec.dst[e])
        info = info_all[:, e]
        n_info = int(info.sum())
        entry = {"attacker": i, "target": j, "attacker_degree": int(deg[i]), "informative_calls": n_info,
                 "attacks": {}, "flags": []}
        if n_info == 0:
            entry["best_attack"] = None
            pairs.append(entry)
            continue
        for name in ATTACKS[protocol]:
            entry["attacks"][name] = _attack_metrics(est[name], rec, info, e)
        verdict = _judge(entry["attacks"], [k for k in ATTACKS[protocol] if k != "baseline"])
        entry["best_attack"] = verdict["best_attack"]
        entry["advantage"] = verdict["advantage"]
        entry["quantization_rel_err_median"] = _nanstat(np.median, qerr[info, j])
        entry["penalty_saturated_fraction"] = float((rec.gamma[info, rec.rev[e]] == final_gamma[rec.rev[e]]).mean())
        if protocol == "paper":
            dc = dcorr_msg[info, e]
            entry["difference_direction_corr_min"] = _nanstat(np.min, dc)
            entry["difference_direction_corr_median"] = _nanstat(np.median, dc)
            if entry["difference_direction_corr_min"] is not None and entry["difference_direction_corr_min"] >= DIRECTION_CORR:
                entry["flags"].append("difference_direction_exact")
        entry["flags"] += verdict["flags"]
        if deg[i] == 1:
            entry["flags"].append("degree1_rho_reveals_penalty")
        if sums_only:
            so = _judge(entry["attacks"], sums_only)
            if deg[i] == 1:
                so["flags"].append("degree1_rho_reveals_penalty")
            entry["sums_only"] = so
        pairs.append(entry)
    agents = []
    for a in range(rec.n_agents):
        mine = [p for p in pairs if p["attacker"] == a]
        against = [p for p in pairs if p["target"] == a]
        flags = sorted({f for p in mine for f in p["flags"]})
        if deg[a] == 1:
            flags = sorted(set(flags) | {"degree1"})
        agent = {"agent": a, "degree": int(deg[a]), "neighbours": sorted(int(p["target"]) for p in mine),
                 "flags": flags, **_exposure(mine, against, lambda p: p["flags"])}
        if sums_only:
            so_flags = sorted({f for p in mine if "sums_only" in p for f in p["sums_only"]["flags"]})
            if deg[a] == 1:
                so_flags = sorted(set(so_flags) | {"degree1"})
            agent["sums_only"] = {"flags": so_flags,
                                  **_exposure(mine, against, lambda p: p.get("sums_only", {}).get("flags", []))}
        agents.append(agent)
    # curves over BCD iterations, averaged over pairs
    nb = int(rec.bcd.max())
    per_bcd = {"baseline": [], "best": []}
    for b in range(nb):
        for key in per_bcd:
            vals = []
            for p in pairs:
                if p.get("best_attack") is None:
                    continue
                name = "baseline" if key == "baseline" else p["best_attack"]
                v = p["attacks"][name]["per_bcd_rel_err"][b]
                if v is not None:
                    vals.append(v)
            per_bcd[key].append(float(np.mean(vals)) if vals else None)
    for name in ATTACKS[protocol]:
        if name == "baseline":
            continue
        per_bcd[name] = []
        for b in range(nb):
            vals = [p["attacks"][name]["per_bcd_rel_err"][b] for p in pairs if p.get("best_attack")]
            vals = [v for v in vals if v is not None]
            per_bcd[name].append(float(np.mean(vals)) if vals else None)
    scored = [p for p in pairs if p.get("best_attack")]
    summary = {
        "pairs": len(pairs),
        "pairs_informative": len(scored),
        "exact_recovery_pairs": sum("exact_recovery" in p["flags"] for p in scored),
        "beats_baseline_pairs": sum("beats_baseline" in p["flags"] for p in scored),
        "baseline_rel_err_median": _nanstat(np.median, [p["attacks"]["baseline"]["rel_err_median"] for p in scored]),
        "best_rel_err_median": _nanstat(np.median, [p["attacks"][p["best_attack"]]["rel_err_median"] for p in scored]),
    }
    for name in ATTACKS[protocol]:
        summary[f"{name}_rel_err_median"] = _nanstat(
            np.median, [p["attacks"][name]["rel_err_median"] for p in scored])
        summary[f"{name}_exact_fraction_mean"] = _nanstat(
            np.mean, [p["attacks"][name]["exact_fraction"] for p in scored])
    if protocol == "paper":
        summary["difference_direction_corr_min"] = _nanstat(
            np.min, [p["difference_direction_corr_min"] for p in scored])
    if sums_only:
        summary["sums_only_exact_recovery_pairs"] = sum("exact_recovery" in p["sums_only"]["flags"] for p in scored)
        summary["sums_only_beats_baseline_pairs"] = sum("beats_baseline" in p["sums_only"]["flags"] for p in scored)
        summary["sums_only_best_rel_err_median"] = _nanstat(
            np.median, [p["attacks"][p["sums_only"]["best_attack"]]["rel_err_median"] for p in scored])
    views = {"honest_but_curious": [k for k in ATTACKS[protocol] if k != "baseline"]}
    if sums_only:
        views["sums_only"] = sums_only
    return {"protocol": protocol, "views": views, "pairs": pairs, "agents": agents, "per_bcd": per_bcd,
            "summary": summary}


def _judge(attacks: dict, cands) -> dict:
    """The best of ``cands`` on one pair (most exact recoveries, then the lowest median
    error), its advantage over the baseline and the flags ``exact_recovery`` /
    ``beats_baseline``."""
    base = attacks["baseline"]
    best = min(cands, key=lambda k: (-(attacks[k]["exact_fraction"] or 0.0), attacks[k]["rel_err_median"]))
    b = attacks[best]
    flags = []
    if (b["exact_fraction"] or 0.0) >= EXACT_FRACTION:
        flags.append("exact_recovery")
    if b["rel_err_median"] <= BEATS_BASELINE_RATIO * base["rel_err_median"]:
        flags.append("beats_baseline")
    return {"best_attack": best,
            "advantage": (base["rel_err_median"] / b["rel_err_median"]
                          if b["rel_err_median"] and b["rel_err_median"] > 0 else None),
            "flags": flags}


def _exposure(mine: list, against: list, flags_of) -> dict:
    """Whom an agent learns exactly, and to whom it is exposed, from its pairs' flags."""
    return {
        "learns_exactly": sorted(p["target"] for p in mine if "exact_recovery" in flags_of(p)),
        "exposed_to": sorted(p["attacker"] for p in against if "exact_recovery" in flags_of(p)),
        "partially_exposed_to": sorted(p["attacker"] for p in against
                                       if "beats_baseline" in flags_of(p) and "exact_recovery" not in flags_of(p)),
    }


# ---------------------------------------------------------------------------------------
# the audit
# ---------------------------------------------------------------------------------------
def _scenario(name: str, seed: int):
    """``(blocks, graph, g_max, solver, overrides)`` of a named scenario (``overrides``: fit
    keywords that take precedence over :func:`run_audit`'s iteration counts)."""
    from .experiments import PAPER_EXPERIMENTS, make_trial
    from .graph import star

    spec = PAPER_EXPERIMENTS["paper_synthetic"]
    blocks, graph = make_trial(spec, seed)
    solver = dict(spec["solver"])
    g_max = solver.pop("g_max")
    if name == "paper_synthetic":
        return blocks, graph, g_max, solver, {}
    if name == "star":
        return blocks, star(len(blocks)), g_max, solver, {}
    if name == "short_admm":
        # 3 ADMM iterations per X-step: the penalty draws are still moving when the first
        # informative messages (BCD iteration 2) go out
        return blocks, graph, g_max, solver, {"x_iters": 3}
    if name == "random_caps":
        # private, different caps: each agent's g_i uniform in [0.5, 1.5] x the paper's
        gen = torch.Generator().manual_seed(int(seed) + 7919)
        caps = (g_max * (0.5 + torch.rand(len(blocks), generator=gen, dtype=torch.float64))).tolist()
        return blocks, graph, caps, solver, {}
    raise ConfigError(f"scenario: unknown scenario {name!r}; use one of {SCENARIOS}")


def _graph_info(graph) -> dict:
    return {"n_agents": int(graph.n_agents), "edges": [list(e) for e in graph.edges],
            "degree": graph.degree.tolist()}


def run_audit(scenarios=SCENARIOS, *, seed=0, bcd_iters=10, x_iters=30,
              y_iters=30, n_max=1e6, g_bits=16, key_bits=128, protocols=("paper", "aggregated"),
              paillier=True, paillier_bcd_iters=2, paillier_x_iters=3, paillier_y_iters=30,
              paillier_scenario="paper_synthetic", plain=True, progress=None) -> dict:
    """Run the privacy audit and return the report (a JSON-ready dict).

    Parameters
    ----------
    scenarios : sequence of str or of (name, blocks, graph, g_max[, solver kwargs])
        Named ones (:data:`SCENARIOS`): ``paper_synthetic`` (``make_trial(PAPER_EXPERIMENTS
        ["paper_synthetic"], seed)``: N = 10, average degree 3, equal caps 0.033), ``star``
        (the same data on a star: 9 degree-1 leaves), ``random_caps`` (the paper's graph,
        each cap drawn in [0.5, 1.5] x 0.033) and ``short_admm`` (the paper's setup with 3
        ADMM iterations per X-step, so that the penalties are still being drawn when the
        first informative messages go out).
    seed : int
    bcd_iters, x_iters, y_iters : int
        Iterations of the recorded runs (the paper runs 100 BCD iterations; the leakage
        per iteration does not depend on how many follow).
    n_max, g_bits, key_bits : codec (``key_bits`` is also the Paillier key size).
    protocols : which neighbour views to audit.
    paillier : bool
        Also run the real Paillier protocol (both ``protocols``) on ``paillier_scenario``
        with ``paillier_*_iters`` iterations and scan its transcript. The audit makes the
        agents' keys itself, and on the ``aggregated`` run it also decrypts every reply on
        its own with its receiver's key (:func:`decrypt_each_check`: the ``decrypt_each``
        attack on real ciphertexts).
    paillier_bcd_iters, paillier_x_iters, paillier_y_iters : int
        Iterations of that Paillier run (short: real encryption is slow).
    paillier_scenario : str
        The named scenario it runs on.
    plain : bool
        Also run ``exchange="plain"`` per scenario for the plain eavesdropper.
    progress : callable(str), optional
    """
    say = progress or (lambda s: None)
    t_start = time.perf_counter()
    report = {
        "meta": {
            "audit": "ppdnmf_torch.audit", "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "python": platform.python_version(), "torch": torch.__version__,
            "settings": {"seed": seed, "bcd_iters": bcd_iters, "x_iters": x_iters, "y_iters": y_iters,
                         "n_max": n_max, "g_bits": g_bits, "key_bits": key_bits,
                         "protocols": list(protocols)},
            "thresholds": {"exact_fraction": EXACT_FRACTION, "beats_baseline_ratio": BEATS_BASELINE_RATIO,
                           "direction_corr": DIRECTION_CORR, "significant": SIGNIFICANT},
        },
        "scenarios": {},
        "eavesdropper_paillier": {},
        "flags": [],
    }
    for sc in scenarios:
        if isinstance(sc, str):
            name = sc
            blocks, graph, g_max, solver, over = _scenario(sc, seed)
        else:
            name, blocks, graph, g_max, *rest = sc
            solver = dict(rest[0]) if rest else {}
            over = {}
        rank = solver.pop("rank", None) or min(5, blocks[0].shape[0])
        fit_kw = dict(solver, g_max=g_max, bcd_iters=bcd_iters, x_iters=x_iters, y_iters=y_iters,
                      negative="allow", seed=seed)
        fit_kw.update(over)
        t0 = time.perf_counter()
        say(f"[{name}] recording the integer protocol ({fit_kw['bcd_iters']} BCD x {fit_kw['x_iters']} "
            "ADMM iterations)")
        rec = record_fit(blocks, graph, rank, kind="quantized", n_max=n_max, g_bits=g_bits, key_bits=key_bits,
                         **fit_kw)
        entry = {"graph": _graph_info(graph), "g_max": g_max,
                 "iterations": {k: fit_kw[k] for k in ("bcd_iters", "x_iters", "y_iters")},
                 "fit": {"nmse": rec.nmse, "consensus": rec.consensus}, "protocols": {}}
        info = (rec.q[:, rec.dst] != rec.q[:, rec.src]).any(-1)
        sat = rec.gamma == rec.gamma[-1][None]
        entry["penalty_schedule"] = {
            "first_informative_bcd_iter": int(rec.bcd[info.any(1)].min()) if info.any() else None,
            "saturated_fraction_informative": float(sat[info].mean()) if info.any() else None,
            "saturated_from_call": int(np.argmax(sat.all(1))) + 1 if sat.all(1).any() else None,
            "distinct_final_gammas": sorted({int(v) for v in rec.gamma[-1]}),
        }
        for proto in protocols:
            say(f"[{name}] attacks under protocol={proto}")
            entry["protocols"][proto] = neighbour_audit(rec, proto)
        if plain:
            say(f"[{name}] plain run for the eavesdropper")
            prec = record_fit(blocks, graph, rank, kind="plain", **fit_kw)
            entry["eavesdropper_plain"] = _eavesdropper_plain_report(prec)
        entry["seconds"] = time.perf_counter() - t0
        report["scenarios"][name] = entry
    if paillier:
        blocks, graph, g_max, solver, _ = _scenario(paillier_scenario, seed)
        rank = solver.pop("rank")
        for proto in protocols:
            say(f"[paillier/{proto}] {key_bits}-bit keys, {paillier_bcd_iters} BCD x {paillier_x_iters} ADMM "
                "iterations, transcript scan")
            t0 = time.perf_counter()
            # the audit makes the keys, so that it can decrypt as each agent can
            keys = _make_keypairs(key_bits, graph.n_agents)
            rec = record_fit(blocks, graph, rank, kind="paillier", protocol=proto, n_max=n_max, g_bits=g_bits,
                             key_bits=key_bits, g_max=g_max, bcd_iters=paillier_bcd_iters,
                             x_iters=paillier_x_iters, y_iters=paillier_y_iters, negative="allow", seed=seed,
                             keypairs=keys)
            ev = eavesdropper_paillier(rec)
            ev["scenario"] = paillier_scenario
            if proto == "aggregated":
                ev["decrypt_each"] = decrypt_each_check(rec, keys)
            del keys
            ev["seconds"] = time.perf_counter() - t0
            report["eavesdropper_paillier"][proto] = ev
    report["flags"] = _collect_flags(report)
    report["meta"]["seconds"] = time.perf_counter() - t_start
    return report


def _make_keypairs(bits: int, count: int) -> list:
    """``count`` Paillier key pairs with distinct moduli (the audit's own, small keys)."""
    from .exchange.paillier import generate_keypairs

    return generate_keypairs(bits, count)


def decrypt_each_check(rec: Recording, private_keys) -> dict:
    """The ``decrypt_each`` attack on a real ``aggregated`` Paillier run.

    Decrypts every reply on its own with its receiver's key
    (:func:`decrypt_individual_replies`), checks the plaintexts against the recording
    (``gamma_ji`` and ``gamma_ji (q_j - q_i)``: the integers the neighbour audit models), and
    recovers ``q_j = q_i + d_ij / gamma_ji`` from the decrypted values alone.

    Returns ``{"penalty_messages", "reply_messages", "ciphertexts", "penalties_match",
    "replies_match", "informative", "q_exact"}``: ``informative`` counts the (call, directed
    edge) pairs with ``q_j != q_i`` and a reply received, ``q_exact`` those at which ``q_j``
    came out bit for bit.
    """
    got = decrypt_individual_replies(rec, private_keys)
    pen_seen, rep_seen = got["penalty_seen"], got["reply_seen"]
    gam, d = got["penalty"], got["reply"]
    qi, qj = rec.q[:, rec.src], rec.q[:, rec.dst]
    pos = pen_seen & rep_seen & (gam > 0)
    q_hat = np.where(pos[..., None], qi + d // np.where(pos, gam, 1)[..., None], qi)
    info = rep_seen & (qj != qi).any(-1)
    return {
        "penalty_messages": got["n_penalty_messages"], "reply_messages": got["n_reply_messages"],
        "ciphertexts": got["n_ciphertexts"],
        "penalties_match": bool(pen_seen.any() and np.array_equal(gam[pen_seen], rec.penalty_replies[pen_seen])),
        "replies_match": bool(rep_seen.any() and np.array_equal(d[rep_seen], rec.replies[rep_seen])),
        "informative": int(info.sum()),
        "q_exact": int((info & (q_hat == qj).all(-1)).sum()),
    }


def _collect_flags(report: dict) -> list:
    """The report's flags. ``view``: ``honest_but_curious`` (the agent runs every attack on
    everything it receives), ``sums_only`` (``aggregated``: the agent decrypts only the two
    sums; such flags hold a fortiori for the honest-but-curious agent) or ``eavesdropper``.
    The sums-only flags carry the prefix ``sums_only_`` (``degree1_rho_reveals_penalty``
    excepted: it is about ``rho_i``, which every view sees)."""
    flags = []
    for sname, sc in report["scenarios"].items():
        for proto, pa in sc["protocols"].items():
            sums_only = "sums_only" in pa.get("views", {})
            for a in pa["agents"]:
                views = [("honest_but_curious", "", a, lambda p: p["flags"])]
                if sums_only:
                    views.append(("sums_only", "sums_only_", a["sums_only"],
                                  lambda p: p.get("sums_only", {}).get("flags", [])))
                for view, prefix, ag, flags_of in views:
                    if ag["learns_exactly"]:
                        flags.append({"scenario": sname, "protocol": proto, "agent": a["agent"], "view": view,
                                      "flag": prefix + "learns_neighbour_U_exactly",
                                      "neighbours": ag["learns_exactly"], "degree": a["degree"]})
                    partial = [p["target"] for p in pa["pairs"] if p["attacker"] == a["agent"]
                               and "beats_baseline" in flags_of(p) and "exact_recovery" not in flags_of(p)]
                    if partial:
                        flags.append({"scenario": sname, "protocol": proto, "agent": a["agent"], "view": view,
                                      "flag": prefix + "beats_trivial_baseline", "neighbours": partial,
                                      "degree": a["degree"]})
                if a["degree"] == 1:
                    flags.append({"scenario": sname, "protocol": proto, "agent": a["agent"],
                                  "view": "sums_only" if sums_only else "honest_but_curious",
                                  "flag": "degree1_rho_reveals_penalty", "neighbours": a["neighbours"],
                                  "degree": 1})
        ev = sc.get("eavesdropper_plain")
        if ev and ev["all_recovered_exactly"]:
            flags.append({"scenario": sname, "protocol": "plain", "agent": None, "view": "eavesdropper",
                          "flag": "eavesdropper_reads_every_U", "neighbours": []})
    for proto, ev in report.get("eavesdropper_paillier", {}).items():
        for a in ev["agents"]:
            for f in a["flags"]:
                flags.append({"scenario": ev["scenario"], "protocol": f"paillier/{proto}", "agent": a["agent"],
                              "view": "eavesdropper", "flag": f, "neighbours": []})
    return flags


# ---------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------
def _fmt(v, spec=".3g"):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, spec)


def format_markdown(report: dict) -> str:
    """A human-readable rendering of :func:`run_audit`'s report."""
    s = report["meta"]["settings"]
    lines = ["# Privacy audit", "",
             f"Created {report['meta']['created']} (torch {report['meta']['torch']}); "
             f"{s['bcd_iters']} BCD x {s['x_iters']} ADMM iterations, n_max = {s['n_max']:g}, "
             f"g_bits = {s['g_bits']}, {s['key_bits']}-bit keys, seed {s['seed']}; "
             f"{report['meta'].get('seconds', 0):.1f} s.", "",
             "Relative error `||U_hat - U_j|| / ||U_j||`, median over the informative ADMM iterations "
             "(`q_j != q_i`). The baseline guesses `U_j := U_i` (what consensus reveals anyway); only "
             "error below it is leakage beyond the output. `exact` is the fraction of informative "
             "iterations at which the attack recovers the transmitted integers `q_j` bit for bit.", ""]
    lines += ["## Flags", ""]
    if not report["flags"]:
        lines.append("None.")
    else:
        lines += ["Agent `i -> [j, ...]`: agent `i` is flagged about its neighbours `j`. View "
                  "`honest_but_curious`: the agent runs every attack on everything it receives (under "
                  "`aggregated` it decrypts each neighbour's reply, which is under its own key); `sums_only`: "
                  "under `aggregated`, an agent that decrypts only the two sums the protocol asks for.", "",
                  "| scenario | protocol | view | flag | agents |", "|---|---|---|---|---|"]
        groups: dict = {}
        for f in report["flags"]:
            groups.setdefault((f["scenario"], f["protocol"], f.get("view", "-"), f["flag"]), []).append(f)
        for (sname, proto, view, flag), fs in groups.items():
            who = "; ".join(
                "all" if f["agent"] is None else
                f"{f['agent']} -> {f['neighbours']}" if f.get("neighbours") else str(f["agent"]) for f in fs)
            lines.append(f"| {sname} | {proto} | {view} | {flag} | {who} |")
    lines.append("")
    lines += ["## Eavesdropper on every link", ""]
    for sname, sc in report["scenarios"].items():
        ev = sc.get("eavesdropper_plain")
        if ev:
            rec = [a["recovered_fraction"] for a in ev["agents"]]
            lines.append(f"- `plain`, {sname}: {ev['n_messages']} clear-text messages; every agent's `U` read "
                         f"back exactly at {min(rec):.0%} of the iterations (max relative error "
                         f"{max(a['rel_err_max'] or 0 for a in ev['agents']):.3g}).")
    for proto, ev in report.get("eavesdropper_paillier", {}).items():
        sc = ev["scan"]
        lines.append(
            f"- `paillier`, protocol `{proto}` ({ev['scenario']}, {ev['key_bits']}-bit keys, "
            f"{ev['slots_per_plaintext']} value(s) per plaintext, {ev['n_calls']} exchanges): {sc['n_messages']} messages, {sc['n_payload_integers']} integers on the wire; "
            f"{sc['n_plaintexts']} distinct plaintexts ({sc['n_values']} values, {sc['n_values_significant']} "
            f"of them with |v| > 2^16, and {sc['n_packed']} packed plaintexts) checked in "
            f"{sc['n_forms']} forms (value, mod n_k, mod n_k^2): **{sc['n_hits']} found**; "
            f"{sc['unobfuscated']} unobfuscated ciphertexts; {sc['repeated_ciphertexts']} repeated "
            f"ciphertexts; chance-match bound {_fmt(sc['chance_match_bound'], '.1e')}.")
        de = ev.get("decrypt_each")
        if de:
            lines.append(
                f"  - `decrypt_each` on this real run: each agent decrypted its neighbours' "
                f"{de['penalty_messages']} penalty replies and {de['reply_messages']} step-5 replies one by one "
                f"with its own private key ({de['ciphertexts']} ciphertexts): penalties match `gamma_ji`: "
                f"{de['penalties_match']}; replies match `gamma_ji (q_j - q_i)`: {de['replies_match']}; `q_j` "
                f"recovered bit for bit at {de['q_exact']} of {de['informative']} informative (call, edge) pairs.")
    lines.append("")
    for sname, sc in report["scenarios"].items():
        g = sc["graph"]
        ps = sc["penalty_schedule"]
        lines += [f"## Scenario `{sname}`", "",
                  f"{sc['iterations']['bcd_iters']} BCD x {sc['iterations']['x_iters']} ADMM iterations; "
                  f"N = {g['n_agents']}, {len(g['edges'])} edges, degrees {g['degree']}; caps g_max = "
                  f"{_fmt(sc['g_max']) if not isinstance(sc['g_max'], list) else [round(c, 4) for c in sc['g_max']]}; "
                  f"final NMSE {sc['fit']['nmse']:.4f}, consensus {sc['fit']['consensus']:.3g}.", "",
                  f"Penalty schedule: the first informative iteration is in BCD iteration "
                  f"{ps['first_informative_bcd_iter']}; at {_fmt(ps['saturated_fraction_informative'], '.1%')} of "
                  f"the informative (iteration, edge) pairs the integer penalty already equals its final value "
                  f"(every penalty saturated from exchange call {ps['saturated_from_call']} on); final integer "
                  f"penalties {ps['distinct_final_gammas']}.", ""]
        for proto, pa in sc["protocols"].items():
            sm = pa["summary"]
            names = [k for k in ATTACKS[proto]]
            so = "sums_only" in pa.get("views", {})
            view = " (honest-but-curious: every attack)" if so else ""
            lines += [f"### Protocol `{proto}`", "",
                      f"{sm['exact_recovery_pairs']} of {sm['pairs_informative']} (attacker, target) pairs: exact "
                      f"recovery{view}; {sm['beats_baseline_pairs']} beat the baseline by 2x or more. Median relative "
                      "error over pairs: " + ", ".join(f"{k} {_fmt(sm[f'{k}_rel_err_median'])}" for k in names)
                      + ".", ""]
            if so:
                lines += [f"Sums only (an agent that decrypts only `S_int_i` and `rho_int_i`; attacks "
                          f"{', '.join(pa['views']['sums_only'])}): {sm['sums_only_exact_recovery_pairs']} of "
                          f"{sm['pairs_informative']} pairs recovered exactly, {sm['sums_only_beats_baseline_pairs']} "
                          f"beat the baseline by 2x or more; median relative error "
                          f"{_fmt(sm['sums_only_best_rel_err_median'])}.", ""]
            if proto == "paper":
                lines += [f"Direction of `U_j - U_i` from each decrypted message: minimum correlation "
                          f"{_fmt(sm['difference_direction_corr_min'], '.6f')}.", ""]
            extra = " sums-only exact | sums-only flags |" if so else ""
            head = "| i -> j | deg i | " + " | ".join(names) + " | best | exact | advantage | flags |" + extra
            lines += [head, "|" + "---|" * (len(names) + 6 + (2 if so else 0))]
            for p in pa["pairs"]:
                if not p.get("best_attack"):
                    continue
                at = p["attacks"]
                row = [f"{p['attacker']} -> {p['target']}", str(p["attacker_degree"])]
                row += [_fmt(at[k]["rel_err_median"]) for k in names]
                row += [p["best_attack"], _fmt(at[p["best_attack"]]["exact_fraction"], ".2f"),
                        _fmt(p["advantage"], ".3g"), ", ".join(p["flags"]) or "-"]
                if so:
                    sp = p["sums_only"]
                    row += [_fmt(at[sp["best_attack"]]["exact_fraction"], ".2f"), ", ".join(sp["flags"]) or "-"]
                lines.append("| " + " | ".join(row) + " |")
            extra = (" learns exactly (sums only) | exposed to (sums only, exact) | exposed to (sums only, "
                     "partial) |") if so else ""
            lines += ["", "Per agent:", "", "| agent | degree | learns exactly | exposed to (exact) | "
                      "exposed to (partial) | flags |" + extra, "|---|---|---|---|---|---|" + ("---|" * 3 if so else "")]
            for a in pa["agents"]:
                row = (f"| {a['agent']} | {a['degree']} | {a['learns_exactly'] or '-'} | "
                       f"{a['exposed_to'] or '-'} | {a['partially_exposed_to'] or '-'} | "
                       f"{', '.join(a['flags']) or '-'} |")
                if so:
                    sa = a["sums_only"]
                    row += (f" {sa['learns_exactly'] or '-'} | {sa['exposed_to'] or '-'} | "
                            f"{sa['partially_exposed_to'] or '-'} |")
                lines.append(row)
            pb = pa["per_bcd"]
            lines += ["", "Mean relative error over pairs, per BCD iteration:", "",
                      "| BCD | " + " | ".join(k for k in pb) + " |", "|---|" + "---|" * len(pb)]
            for b in range(len(pb["baseline"])):
                lines.append(f"| {b + 1} | " + " | ".join(_fmt(pb[k][b]) for k in pb) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"
