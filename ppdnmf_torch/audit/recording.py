"""Recording what goes through the exchange: the recording exchanges and :class:`Recording`
(a PPDNMF run is recorded by :func:`ppdnmf_torch.models.ppdnmf.audit.record_fit`).

A recording exchange is an ordinary exchange kind (``plain``, ``quantized``, ``paillier`` or
``secagg``) that keeps a copy of step 5's inputs at every call (``U``, ``g`` and, for
the integer kinds, ``q`` and ``gamma``). :func:`make_recording_exchange` is the one place
that builds them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ConfigError
from ..exchange import PaillierSpec, PlainSpec, QuantizedSpec, SecAggSpec, make_exchange
from ..exchange.base import Exchange
from ..exchange.integer import encode_inputs

__all__ = [
    "Recording",
    "Recorder",
    "make_recording_exchange",
    "as_recording",
]


class Recorder:
    """Mixin for any exchange kind (:func:`~ppdnmf_torch.exchange.make_exchange`'s ``mixin``):
    keeps a copy of what every ``exchange()`` call handled (step 5's inputs) in ``records``,
    and, for the Paillier kind, the agents' public moduli (``moduli``, public information)."""

    def bind(self, topology, **kw):
        super().bind(topology, **kw)
        self.__dict__.setdefault("records", [])
        self.moduli = [int(a.public_key.n) for a in getattr(self, "agents", ())]

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        out = super().exchange(U, g, bcd_iter=bcd_iter, admm_iter=admm_iter, out=out)
        rec = {"bcd": int(bcd_iter), "admm": int(admm_iter),
               "U": U.detach().to("cpu", torch.float64).clone(), "g": g.detach().to("cpu", torch.float64).clone()}
        codec = getattr(self, "codec", None)
        if codec is not None:
            q, gamma, _ = encode_inputs(codec, self.topology, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
            rec["q"] = q.cpu().clone()
            rec["gamma"] = gamma.cpu().clone()
        self.__dict__.setdefault("records", []).append(rec)
        return out


def make_recording_exchange(kind="quantized", *, protocol="aggregated", n_max=1e6, g_bits=16, key_bits=128,
                            keypairs=None, paillier_options=None, transcript=True) -> Exchange:
    """A recording exchange of ``kind`` in {"plain", "quantized", "paillier", "secagg"}, made by
    the exchange factory with the :class:`Recorder` mixin (a Paillier or secagg one always keeps
    its transcript by default; ``secagg`` takes no ``protocol`` and no ``key_bits``).

    ``paillier_options``: further settings of :class:`~ppdnmf_torch.exchange.PaillierSpec`
    (e.g. ``workers``, ``packing``). ``transcript=False``: a ``secagg`` exchange keeps no transcript
    (long runs whose sums only are attacked).
    """
    if kind == "plain":
        return make_exchange(PlainSpec(), mixin=Recorder)
    if kind == "quantized":
        return make_exchange(QuantizedSpec(protocol=protocol, n_max=n_max, g_bits=g_bits, key_bits=key_bits),
                             mixin=Recorder)
    if kind == "paillier":
        import warnings

        from ..exchange.paillier import InsecureKeyWarning

        spec = PaillierSpec(protocol=protocol, n_max=n_max, g_bits=g_bits, key_bits=key_bits, keypairs=keypairs,
                            record_transcript=True, **(paillier_options or {}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InsecureKeyWarning)  # small keys are the audit's point
            return make_exchange(spec, mixin=Recorder)
    if kind == "secagg":  # keeps its transcript (signed keys, masked messages) unless told not to
        return make_exchange(SecAggSpec(n_max=n_max, g_bits=g_bits, record_transcript=bool(transcript)),
                             mixin=Recorder)
    raise ConfigError(f"kind: unknown exchange kind {kind!r}; use 'plain', 'quantized', 'paillier' or 'secagg'")


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
        Wire messages (``paillier``: :class:`~ppdnmf_torch.exchange.paillier.WireMessage`; ``secagg``:
        :class:`~ppdnmf_torch.exchange.secagg.WireMessage`).
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

    def need_ints(self) -> None:
        """Raise :class:`~ppdnmf_torch.errors.ConfigError` unless this recording holds the integers."""
        if self.q is None:
            raise ConfigError("this analysis needs an integer recording (exchange 'quantized' or 'paillier')")

    @property
    def w(self) -> np.ndarray:
        """``gamma_ij gamma_ji`` per call and directed edge ``(T, 2E)``."""
        self.need_ints()
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
        self.need_ints()
        return self.gamma[:, self.rev, None] * (self.q[:, self.dst] - self.q[:, self.src])

    @property
    def penalty_replies(self) -> np.ndarray:
        """``gamma_ji`` for directed edge ``e = i -> j``: what ``i`` gets by decrypting ``j``'s
        reply ``E_i(gamma_ji)`` of the penalty round (``protocol="aggregated"``, step 1) on its
        own, ``(T, 2E)`` int64."""
        self.need_ints()
        return self.gamma[:, self.rev]

    @property
    def S_int(self) -> np.ndarray:
        """``S_int_i = sum_j gamma_ij gamma_ji (q_j - q_i)`` ``(T, N, P)``: what ``i`` decrypts
        under ``protocol="aggregated"``."""
        terms = self.gamma[:, :, None] * self.replies
        out = np.zeros(self.q.shape, dtype=np.int64)
        np.add.at(out, (slice(None), self.src), terms)
        return out


def as_recording(exch, graph, kind, protocol, n_max, g_bits, result) -> Recording:
    """The :class:`Recording` of what a recording exchange (:func:`make_recording_exchange`)
    saw during a run of any model, with the run's settings and ``result``."""
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
