"""``exchange="paillier"``: the real secure exchange (lines 10-16) with :mod:`phe`, on the host.

Every node (agent ``i`` of trial ``t`` is node ``t * N + i``) is an :class:`~.keys._Agent`
with its own Paillier key pair ``(kp_i, ks_i)``, generated in :meth:`PaillierExchange.bind`.
The private key never leaves its agent object: only the agent decrypts, the messages
carry ciphertexts and public keys only, and neither the agents nor the exchange can be
pickled, copied or printed with key material.

The inputs are quantized exactly as ``exchange="quantized"`` does
(:func:`~ppdnmf_torch.exchange.integer.encode_inputs`: ``q_i = round(n_max U_i)``,
``gamma = round(2^s g)``, the same range checks), and the decrypted integers go through
the same :meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.decode`, so the two kinds
return bit-identical ``S`` and ``rho``. Negative integers are encrypted as residues mod
``n``; decrypted residues are mapped back with
:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.from_residue`, which raises
:class:`~ppdnmf_torch.exchange.codec.CodecRangeError` instead of wrapping silently.

Message flows (``i`` an agent, ``j in N_i``; ``E_i`` encryption under ``kp_i``)
--------------------------------------------------------------------------------
``protocol="masked"`` (default; :mod:`.masked`, docs/SECURE_EXCHANGE.md): in :meth:`bind`,
the public keys and the mask seeds (per agent ``i`` and pair ``j < k`` of its neighbours,
drawn by ``j`` and sent to ``k`` through ``i`` under ``k``'s key; per edge, between its ends).
Then per ADMM iteration:

1. step 1: ``i -> j``: ``E_i(gamma_ij)``; ``j -> i``: ``E_i(gamma_ij)^{gamma_ji}`` times ``j``'s mask
   unit; ``i`` multiplies the replies (the masks cancel) and decrypts ``rho_int_i``;
2. step 5: ``i -> j``: the shifted encryptions ``E_i(gamma_ij 2^{w t})``; ``j -> i``: per packed
   block ``E_i(gamma_ij gamma_ji M(q_j))`` times its mask unit; ``i`` multiplies, decrypts
   ``A_i = sum_j rho_ij q_j`` and computes ``S_int_i = A_i - rho_int_i q_i``.

Every reply, decrypted on its own, is uniformly random; only the products carry the sums.

``protocol="paper"`` (lines 10-16 as printed):

1. step 1: the simulation hands ``rho_i = sum_j gamma_ij gamma_ji / 4^s`` to agent ``i``.
   The paper does not say how ``i`` obtains it without learning ``g_{j->i}``; this is an
   assumption of the simulation (see ALGORITHM.md, "A gap in the paper's protocol").
2. ``i -> j``: ``E_i(-q_i)`` (``P = L K`` ciphertexts) and ``kp_i``.
3. ``j -> i``: ``[E_i(q_j) E_i(-q_i)]^{gamma_ji} = E_i(gamma_ji (q_j - q_i))``.
4. ``i`` decrypts every neighbour's reply on its own, multiplies by its ``gamma_ij`` and
   sums: ``S_int_i = sum_j gamma_ij gamma_ji (q_j - q_i)``.

``protocol="aggregated"``:

1. step 1 (:meth:`PaillierExchange.penalty_sums`, an encrypted mini-round):
   ``i -> j``: ``kp_i``; ``j -> i``: ``E_i(gamma_ji)``; ``i`` raises each reply to
   ``gamma_ij``, multiplies over its neighbours and decrypts only the sum ``rho_int_i``.
2. step 5 (:meth:`PaillierExchange.exchange`): ``i -> j``: ``E_i(-q_i)``;
   ``j -> i``: ``E_i(gamma_ji (q_j - q_i))`` as above; ``i`` raises each reply to
   ``gamma_ij``, multiplies over its neighbours and decrypts only ``S_int_i``.
   ``rho_i`` is the one of step 1 (the mini-round runs again here only when the
   penalties differ from step 1's).

If agent ``i`` decrypts only the two sums, it learns ``S_i`` and ``rho_i`` and nothing per
neighbour (with one neighbour, ``rho_i`` still reveals that neighbour's penalty). But every
reply is encrypted under ``i``'s own key: an honest-but-curious ``i`` that decrypts each
reply learns ``gamma_ji`` and then ``q_j`` exactly, as in the ``paper`` protocol. Both
printed protocols protect against eavesdroppers, not against curious neighbours; ``masked``
protects against both (measured by :mod:`ppdnmf_torch.audit`; see docs/THREAT_MODEL.md).

The operation counts and bytes of the three protocols are derived in
:mod:`ppdnmf_torch.exchange.costmodel`; :meth:`PaillierExchange.costs` reports what this
stage actually performed (the tests check that the two agree).

Per call, the quantized integers cross from the device to the host once (one ``.cpu()``
of one int64 tensor) and the integer result goes back once (timed as ``time_transfer``).

The rounds themselves, on a naive and a fast host path with the same numbers, are in
:mod:`.rounds`; the keys and primitives in :mod:`.keys`; the links in :mod:`.network`.
"""
from __future__ import annotations

import time
import warnings

import torch

from ...graph import Topology, ring
from ..base import Exchange, ExchangeOutput
from ..codec import IntegerCodec
from ..costmodel import COUNT_KEYS, SETUP_KEYS, TIME_KEYS, CostLedger, PaillierOpCosts, add_estimates, estimate_seconds
from ..integer import Step1Penalties, encode_inputs, integer_penalty_sums
from ..packing import check_protocol_range, derive_layout
from ..spec import SECURE_KEY_BITS, PaillierSpec
from .calibration import (PATH_MAX_ROUNDS, PATH_ROUNDS, PATH_SECONDS, PATH_VALUES, PATH_VALUES_UNPACKED, calibrate,
                          path_settings)
from .keys import InsecureKeyWarning, RawPaillier, make_agents
from .masked import MaskPlan, agree_seeds
from .network import Network
from .obfuscation import HoldsPrivateKey, default_djn_exponent_bits
from .pool import resolve_workers
from .rounds import FastRounds, NaiveRounds

__all__ = ["PaillierExchange", "warn_if_insecure", "calibrate_for", "time_path"]


class PaillierExchange(HoldsPrivateKey, Exchange):
    """The secure exchange with real Paillier encryption (:mod:`phe`), on the host.

    Parameters
    ----------
    codec : IntegerCodec
        Quantization and range; ``codec.key_bits`` is the modulus size of every agent's key
        (even, ``>= 64``; below 2048 bits an :class:`InsecureKeyWarning` is issued).
    protocol : {"masked", "aggregated", "paper"}
        Message pattern (module docstring). ``masked`` (:mod:`.masked`): agent ``i`` learns
        only its two sums, every individual reply being uniformly random on its own; its
        seeds are agreed in :meth:`bind` (``setup_*`` costs). In ``paper`` mode ``rho_i`` is
        handed to agent ``i`` by the simulation (an assumption the paper leaves open).
    keypairs : sequence of (PaillierPublicKey, PaillierPrivateKey), optional
        Pre-made keys (tests, benchmarks), one per node, used in node order instead of
        generating them in :meth:`bind`. Each private key is moved into its agent; keys
        handed in are only as private as the caller keeps them.
    cost_model : bool or PaillierOpCosts
        Also report ``estimated_seconds`` (the cost model's prediction for the counted
        operations) next to the measured times, to validate the model.
    record_transcript : bool
        Keep every message sent, as an eavesdropper on every link would see it
        (:class:`~.network.WireMessage`; for the privacy audit and tests).
    fast : bool
        ``True`` (default): the fast host path (:class:`~.rounds.FastRounds`: raw ``mpz``
        arithmetic plus the switches that follow). ``False``: the naive per-value path
        (:class:`~.rounds.NaiveRounds`) (one phe ``raw_encrypt``
        per value, serial), kept for comparison; the switches below are then ignored.
    packing : bool
        Several values per plaintext (:mod:`.packing`; default True). Encryptions,
        decryptions, homomorphic operations and bytes of a message drop from ``P`` to
        ``ceil(P / S)`` with ``S`` slots per plaintext (32 at 2048 bits).
    slot_bits : int, optional
        Narrower slots than the codec's range needs (more per plaintext); values must then
        fit ``2^(slot_bits - 1)`` and a value that does not raises ``CodecRangeError`` before
        anything is encrypted. Default: derived from the codec's limit.
    precompute : bool
        Obfuscators ahead of use (default True): with a worker pool, a stock per public key
        refilled in the background; and the key owner makes the obfuscators of its own
        encryptions with its CRT factors ``p, q`` (same distribution, cheaper; see
        docs/PERFORMANCE.md), inside its agent.
    djn : bool
        Damgard-Jurik-Nielsen short-exponent obfuscators ``h_s^x`` with a fixed-base table
        (default False). Much faster per obfuscator (docs/PERFORMANCE.md) under an extra
        assumption: DCR stays hard with short random exponents in the subgroup generated
        by ``h_s`` (DJN 2010); see :mod:`.obfuscation`.
    djn_exponent_bits : int, optional
        Bits of the DJN exponent ``x`` (default ``2 x`` the modulus' security level:
        224 at 2048 bits; IPCL and HEU use ``key_bits / 2``). Fewer bits than the default
        warn (:class:`InsecureKeyWarning`): ``x`` falls to a baby-step giant-step search
        in about ``2^(bits / 2)`` steps.
    workers : int, optional
        Worker processes for the public-key work (obfuscators for every key). Default
        ``os.cpu_count()`` for keys of at least 1024 bits and in-process below, where a task
        costs less than shipping it; ``0`` or ``1``: in-process. Workers only ever receive
        public moduli ``n`` (:mod:`.pool`); decryption and the owner's CRT obfuscators stay
        in the agent's process. With ``k >= 2`` workers and keys of at least 2048 bits
        (:data:`~.pool.LANE_MIN_KEY_BITS`) the per-edge homomorphic work (replies and scalar
        multiplications) also runs in ``k`` thread lanes of this process (the caller's
        thread and ``k - 1`` helpers, :class:`~.pool.ThreadLanes`), with the same results;
        if the pool cannot start, neither runs. So the default starts ``os.cpu_count()``
        processes and as many lanes, more threads than cores while both are busy (measured
        against no lanes in docs/PERFORMANCE.md).
    pool_audit : callable, optional
        Called with the pickled arguments of every task sent to a worker (tests).
    """

    name = "paillier"

    def __init__(self, codec: IntegerCodec, *, protocol: str = "masked", keypairs=None, cost_model=False,
                 record_transcript: bool = False, fast: bool = True, packing: bool = True, slot_bits=None,
                 precompute: bool = True, djn: bool = False, djn_exponent_bits=None, workers=None,
                 pool_audit=None):
        super().__init__()
        # the settings' rules (the spec's); the keys stay out of the spec this exchange keeps
        spec = PaillierSpec(protocol=protocol, n_max=codec.n_max, key_bits=codec.key_bits, g_bits=codec.g_bits,
                            cost_model=cost_model, fast=fast, packing=packing, slot_bits=slot_bits,
                            precompute=precompute, djn=djn, djn_exponent_bits=djn_exponent_bits, workers=workers,
                            record_transcript=record_transcript, pool_audit=pool_audit)
        self._spec = spec
        kb = codec.key_bits
        self.codec = codec
        self.protocol = protocol
        self.fast = fast
        self.packing = packing and fast
        self.precompute = precompute
        self.djn = djn
        self.djn_exponent_bits = (djn_exponent_bits or default_djn_exponent_bits(kb)) if djn else None
        warn_if_insecure(kb, self.djn_exponent_bits)
        #: the slot layout of the fast path (one slot per plaintext without packing)
        self.layout = derive_layout(codec, packing=self.packing, slot_bits=slot_bits) if fast else None
        self.workers = resolve_workers(workers, kb) if fast else 0
        self._cost_model = cost_model
        self._pending_keys = list(keypairs) if keypairs is not None else None
        #: whether bind generates the keys (the cost model prices their generation only then)
        self._generates_keys = keypairs is None
        self._agents: tuple = ()
        self._net = None
        self._rounds = None
        self._ledger = CostLedger(0, timers=True)
        self._rho_cache = None
        self._step1 = Step1Penalties()
        self._closed = False
        #: every message on the wire (ciphertexts and public keys only) when recording
        self.transcript: list | None = [] if record_transcript else None

    @property
    def spec(self) -> PaillierSpec:
        """The settings (without ``keypairs``: the keys live in the agents only)."""
        return self._spec

    # -- lifecycle ---------------------------------------------------------------------
    def bind(self, topology, *, dtype, device, fuse=False):
        """Make the agents (one key pair each) and the rounds of this topology."""
        if self._closed:
            raise RuntimeError("PaillierExchange: closed (its keys are gone); make a new exchange")
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        self._close_rounds()  # a bind after a bind: the earlier rounds' pool and lanes stop
        topo = self.topology
        masked = self.protocol == "masked"
        self._ledger = CostLedger(topo.n_agents, timers=True, setup=masked)
        raw = RawPaillier(self._ledger)
        self._rho_cache = None
        self._step1.clear()
        pending, self._pending_keys = self._pending_keys, None  # each private key moves into its agent
        self._agents = make_agents(pending, n_nodes=topo.n_nodes, n_agents=topo.n_agents, codec=self.codec,
                                   raw=raw)
        del pending
        self._net = Network(topo, self._agents, self._ledger, device, self.transcript)
        if not self.fast:
            self._rounds = NaiveRounds(self._net, raw)
        else:
            self._rounds = FastRounds(self._net, codec=self.codec, layout=self.layout, protocol=self.protocol,
                                      precompute=self.precompute, djn=self.djn, djn_bits=self.djn_exponent_bits,
                                      workers=self.workers, pool_audit=self._spec.pool_audit)
            self.workers = self._rounds.workers  # 0 when the pool did not start
        if masked:  # the seed agreement, once: the seeds go into their agents
            plan = MaskPlan(self._net)
            self._rounds.enable_masked(plan)
            agree_seeds(self._net, plan, key_bits=self.codec.key_bits, djn_bits=self.djn_exponent_bits)

    def _close_rounds(self) -> None:
        if self._rounds is not None:
            self._rounds.close()

    def close(self) -> None:
        """Drop every agent and with it every private key; stop the worker pool. The exchange
        cannot be used again."""
        self._close_rounds()
        for ag in self._agents:
            ag.forget()  # also in the references a caller kept (a callback's info.exchange, say)
        self._agents = ()
        self._net = None
        self._pending_keys = None
        self._rho_cache = None
        self._step1.clear()
        self._closed = True

    @property
    def agents(self) -> tuple:
        """The nodes' :class:`~.keys._Agent` objects (public keys and a ``decrypt`` method each)."""
        return self._agents

    @property
    def rounds(self):
        """The protocol rounds of the bound run (:class:`~.rounds.NaiveRounds` or
        :class:`~.rounds.FastRounds`, with its ``pool`` and ``lanes``), or None before bind."""
        return self._rounds

    def _check_ready(self):
        if self._closed:
            raise RuntimeError("PaillierExchange: closed (its keys are gone); make a new exchange")
        if self.topology is None:
            raise RuntimeError("PaillierExchange: call bind() before the first exchange")

    # -- step 1 ------------------------------------------------------------------------
    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        """``rho_i``: handed by the simulation (``paper``) or an encrypted round (``masked``, ``aggregated``)."""
        self._check_ready()
        self._net.begin(bcd_iter, admm_iter)
        topo = self.topology
        gamma, w = self._step1.encode(self.codec, topo, g, bcd_iter=bcd_iter, admm_iter=admm_iter)  # checked
        if self.protocol == "paper":
            # the simulation hands rho_i to agent i (see the module docstring)
            return self.codec.decode_rho(integer_penalty_sums(w, topo.src, topo.n_nodes))
        return self.codec.decode_rho(self._penalty_round(self._net.to_host(gamma), bcd_iter, admm_iter))

    def _penalty_round(self, gamma: list, bcd_iter, admm_iter) -> torch.Tensor:
        """The penalty round; step 5 reuses its ``rho_int`` while the penalties stay the same."""
        rounds = self._rounds
        if rounds.masked is not None:
            rho_int = rounds.masked.penalty_round(gamma, bcd_iter, admm_iter)
        else:
            rho_int = rounds.penalty_round(gamma, bcd_iter, admm_iter)
        self._rho_cache = (list(gamma), rho_int)
        return rho_int

    # -- step 5 ------------------------------------------------------------------------
    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        """``S_i`` and ``rho_i`` for every node, through the encrypted protocol."""
        self._check_ready()
        self._net.begin(bcd_iter, admm_iter)
        topo, rounds = self.topology, self._rounds
        A = topo.n_nodes
        q, gamma, w = encode_inputs(self.codec, topo, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter,
                                    penalties=self._step1.take(g))
        P = int(q.shape[1])
        # before anything is encrypted (the naive path too: it would find out at decryption)
        check_protocol_range(self.codec, rounds.layout, topo, self.protocol, q, gamma, w,
                             bcd_iter=bcd_iter, admm_iter=admm_iter)
        rounds.prepare(P)
        host = self._net.to_host(torch.cat([q.reshape(-1), gamma]))  # the one device -> host transfer
        qh = [host[a * P:(a + 1) * P] for a in range(A)]
        gh = host[A * P:]
        if self.protocol == "paper":
            S_int = rounds.paper_round(qh, gh, P, bcd_iter, admm_iter)
            rho_int = integer_penalty_sums(w, topo.src, A)  # handed by the simulation
        else:
            cache = self._rho_cache
            if cache is not None and cache[0] == gh:
                rho_int = cache[1]
            else:
                rho_int = self._penalty_round(gh, bcd_iter, admm_iter)
            if rounds.masked is not None:
                # i decrypts A_i = sum_j rho_ij q_j; S_int_i = A_i - rho_int_i q_i, exact in int64
                # (|A_i| and |S_int_i| are below 2^62, checked before anything was encrypted)
                A = rounds.masked.value_round(qh, gh, P, bcd_iter, admm_iter)
                S_int = A - rho_int.to(A.device)[:, None] * q.to(A.device)
            else:
                S_int = rounds.aggregated_round(qh, gh, P, bcd_iter, admm_iter)
        S, rho = self.codec.decode(S_int, rho_int, dtype=U.dtype)
        return ExchangeOutput(S, rho)

    # -- costs -------------------------------------------------------------------------
    def _estimates(self):
        cm = self._cost_model
        if cm is False:
            return None
        if cm is True:
            cm = self._cost_model = calibrate_for(self._spec)
        return cm

    def costs(self) -> dict:
        """Cumulative counts (:data:`~ppdnmf_torch.exchange.costmodel.COUNT_KEYS`), ``key_pairs``
        and times (:data:`~ppdnmf_torch.exchange.costmodel.TIME_KEYS`, seconds); with
        ``cost_model`` also the estimate of the run
        (:func:`~ppdnmf_torch.exchange.costmodel.run_seconds`: ``estimated_seconds`` and the rest of
        :data:`~ppdnmf_torch.exchange.costmodel.ESTIMATE_KEYS`; no key generation when the keys
        were handed in)."""
        led = self._ledger
        out = {k: led.total[k] for k in COUNT_KEYS + TIME_KEYS}
        out["key_pairs"] = 0 if self.topology is None else self.topology.n_nodes
        masked = self.protocol == "masked"
        if masked:
            out.update({k: led.total.get(k, 0) for k in SETUP_KEYS})
            out["time_setup"] = led.total.get("time_setup", 0.0)
        return add_estimates(out, self._estimates(), setup=masked, generates_keys=self._generates_keys)

    def pop_iteration_costs(self) -> list:
        """Per-ADMM-iteration counts and times since the last call (``bcd_iter``, ``admm_iter``, ...)."""
        records = self._ledger.pop()
        oc = self._estimates()
        if oc is not None:
            for rec in records:
                rec["estimated_seconds"] = estimate_seconds(rec, oc)
        return records

    def bytes_per_edge(self) -> dict:
        """Cumulative bytes sent ``"i->j"`` (trial-0 node ids; ciphertexts and public keys)."""
        return dict(self._ledger.edges)

    # -- no key material out ----------------------------------------------------------
    def __repr__(self) -> str:
        if self.fast:
            lay = self.layout
            path = (f", fast: {lay.slots} slot{'s' if lay.slots != 1 else ''} x {lay.slot_bits} bits"
                    f"{', precompute' if self.precompute else ''}"
                    f"{f', djn ({self.djn_exponent_bits}-bit exponents)' if self.djn else ''}, workers={self.workers}")
        else:
            path = ", naive"
        return (f"PaillierExchange(protocol={self.protocol!r}, key_bits={self.codec.key_bits}, "
                f"n_max={self.codec.n_max:g}, g_bits={self.codec.g_bits}, agents={len(self._agents)}{path}"
                f"{', closed' if self._closed else ''})")


def warn_if_insecure(key_bits: int, djn_exponent_bits) -> None:
    """:class:`~.keys.InsecureKeyWarning` for keys shorter than :data:`~.keys.SECURE_KEY_BITS`,
    and for DJN exponents shorter than twice the key's security level."""
    if key_bits < SECURE_KEY_BITS:
        warnings.warn(
            f"key_bits={key_bits}: Paillier keys shorter than {SECURE_KEY_BITS} bits can be broken and are "
            "for experiments only (the paper's experiments use 128-bit keys)",
            InsecureKeyWarning, stacklevel=4,
        )
    safe = default_djn_exponent_bits(key_bits)
    if djn_exponent_bits is not None and djn_exponent_bits < safe:
        # a baby-step giant-step search finds an x of b bits in about 2^(b/2) steps, from
        # the public h_s alone: it strips the obfuscator off every ciphertext
        warnings.warn(
            f"djn_exponent_bits={djn_exponent_bits}: DJN exponents shorter than {safe} bits (2 x the "
            f"{key_bits}-bit key's security level) let an eavesdropper recover them in about "
            f"2^{djn_exponent_bits // 2} steps and read every ciphertext; for experiments only",
            InsecureKeyWarning, stacklevel=4,
        )


# -- the estimate's calibration on a run's own path ---------------------------------------
def calibrate_for(spec) -> PaillierOpCosts:
    """The per-operation costs of ``spec``'s run (a ``PaillierSpec``, or a ``QuantizedSpec``
    standing in for one): :func:`~.calibration.calibrate` at ``spec.key_bits``, scaled by the
    run's own path (:func:`~.calibration.path_settings`, :func:`time_path`). The one calibration
    of every command's Paillier estimate (docs/SECURE_EXCHANGE.md, "What a run costs")."""
    return calibrate(spec.key_bits, path=path_settings(spec), time_path=time_path)


def time_path(keys, raw: PaillierOpCosts, path: dict) -> float:
    """The path's factor: an exchange of the settings ``path`` with ``keys`` (three pairs, moved
    into its agents) on a triangle; after a first ADMM iteration (the workers' start, the first
    stock), at least :data:`~.calibration.PATH_ROUNDS` more and as many as
    :data:`~.calibration.PATH_SECONDS` take (at most :data:`~.calibration.PATH_MAX_ROUNDS`): their
    seconds over what ``raw`` prices their counted operations at. The exchange is closed at the
    end: its keys die with it."""
    codec = IntegerCodec(n_max=path["n_max"], key_bits=raw.key_bits, g_bits=path["g_bits"])
    with warnings.catch_warnings():  # a short key is the run's to warn about, not its measurement's
        warnings.simplefilter("ignore", InsecureKeyWarning)
        exch = PaillierExchange(codec, keypairs=keys, **{k: v for k, v in path.items() if k not in ("n_max", "g_bits")})
    try:
        topo = Topology.from_graphs([ring(3)])
        exch.bind(topo, dtype=torch.float64, device=torch.device("cpu"))
        lk = PATH_VALUES if exch.layout is not None and exch.layout.slots > 1 else PATH_VALUES_UNPACKED
        gen = torch.Generator().manual_seed(0)
        wall = priced = 0.0
        for m in range(PATH_MAX_ROUNDS + 1):
            g = 0.03 + 0.03 * torch.rand(topo.n_directed_edges, generator=gen, dtype=torch.float64)
            U = torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64)
            before = exch.costs()
            t0 = time.perf_counter()
            exch.penalty_sums(g, bcd_iter=1, admm_iter=m + 1)
            exch.exchange(U, g, bcd_iter=1, admm_iter=m + 1)
            seconds = time.perf_counter() - t0
            after = exch.costs()
            if m:
                wall += seconds
                priced += estimate_seconds({k: after[k] - before[k] for k in COUNT_KEYS}, raw)
                if m >= PATH_ROUNDS and wall >= PATH_SECONDS:
                    break
    finally:
        exch.close()
    return wall / max(priced, 1e-12)
