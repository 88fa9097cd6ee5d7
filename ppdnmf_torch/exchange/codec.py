"""The integer codec shared by the emulated and the real Paillier exchange.

Paillier encrypts integers modulo ``n``. Before step 5 each agent

* scales its ``U_i`` by ``n_max`` (the paper's ``N_max``) and rounds to the nearest
  integer, ``q_i = round(n_max U_i)``;
* scales each penalty draw by ``2^s`` (``s = g_bits``) and rounds, ``gamma = round(2^s g)``,
  because the homomorphic scalar multiplication needs an integer exponent;
* represents a negative integer ``v`` as ``v mod n``.

Both paths compute the same integers ``S_int_i = sum_j gamma_ij gamma_ji (q_j - q_i)``
and ``rho_int_i = sum_j gamma_ij gamma_ji``, and both go through :meth:`IntegerCodec.decode`,
so ``exchange="quantized"`` and ``exchange="paillier"`` return bit-identical ``S`` and
``rho``.

Range. A plaintext is only meaningful while ``|v| < n/3`` (the bound :mod:`phe` uses to
tell negatives from positives). Every partial sum above is bounded by
``B_i = sum_j gamma_ij gamma_ji |q_j - q_i|``, so the codec requires ``B_i`` (and every
``|q_i|``) to stay below its ``limit``. The limit is a power of two derived from the key
size alone, ``2^(key_bits - 3) < n/3`` for any ``key_bits``-bit modulus, and capped at
``2^62`` because the emulation computes in int64 (the real path decodes into the same
int64 tensors). A value at or above the limit raises :class:`CodecRangeError`; nothing
ever wraps silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ConfigError, PPDNMFError

__all__ = ["CodecRangeError", "IntegerCodec", "INT64_LIMIT", "MAX_G_BITS", "check_codec_params",
           "first_sum_over"]

#: the emulation's int64 ceiling: partial sums stay below 2^62, far from 2^63 - 1
INT64_LIMIT = 1 << 62


class CodecRangeError(PPDNMFError):
    """A quantized value does not fit the codec's range: it would wrap modulo ``n``.

    Attributes
    ----------
    trial, agent : int
        Where the value occurs (``trial`` is 0 outside batched trials).
    bcd_iter, admm_iter : int
        1-based iteration indices (0 when not inside the solver).
    value : int
        The offending magnitude (a quantized entry, or the bound of a neighbour sum).
    limit : int
    """

    def __init__(self, message, *, trial=0, agent=0, bcd_iter=0, admm_iter=0, value=0, limit=0):
        super().__init__(message)
        self.trial, self.agent = trial, agent
        self.bcd_iter, self.admm_iter = bcd_iter, admm_iter
        self.value, self.limit = value, limit


#: the largest ``g_bits`` (penalty scale ``2^g_bits``) the codec takes
MAX_G_BITS = 30
#: the largest ``n_max``: ``round(n_max U)`` is an int64, and ``|U| >= 1`` at the all-ones start
MAX_N_MAX = float(2**62)
#: integer penalties stay below this, so that ``gamma_ij gamma_ji < 2^62`` holds in int64
_GAMMA_LIMIT = float(2**31)


def check_codec_params(n_max, g_bits, key_bits) -> None:
    """The codec's rules, for :class:`IntegerCodec` and the exchange specs (:mod:`.spec`) alike.

    Raises
    ------
    ConfigError
        Naming ``n_max`` (a finite number ``>= 1``), ``g_bits`` (an integer in
        ``[0, MAX_G_BITS]``) or ``key_bits`` (an integer ``>= 16``).
    """
    if not (isinstance(n_max, (int, float)) and math.isfinite(n_max) and n_max >= 1):
        raise ConfigError(f"n_max: must be a finite number >= 1, got {n_max!r}")
    if n_max > MAX_N_MAX:  # q = round(n_max U) is an int64: |U| >= 1 (the all-ones start) would overflow it
        raise ConfigError(f"n_max: {n_max:g} is above the largest scale the codec holds, 2^62 (~4.6e18): "
                          f"q = round(n_max U) is a 64-bit integer; use n_max <= {MAX_N_MAX:.3g}")
    if not isinstance(g_bits, int) or not 0 <= g_bits <= MAX_G_BITS:
        raise ConfigError(f"g_bits: must be an integer in [0, {MAX_G_BITS}], got {g_bits!r}")
    if not isinstance(key_bits, int) or key_bits < 16:
        raise ConfigError(f"key_bits: must be an integer >= 16, got {key_bits!r}")


def _flat_to_trial_agent(index: int, n_agents: int) -> tuple[int, int]:
    return divmod(int(index), max(1, int(n_agents)))


def abs_max(t: torch.Tensor) -> float:
    """``max |t|`` as a Python float (0.0 for an empty tensor), NaN if ``t`` holds one.

    From ``aminmax``: one pass, without the temporary of ``t.abs()`` (a large one costs its
    fresh pages on every call, more than the pass itself).
    """
    if t.numel() == 0:
        return 0.0
    lo, hi = torch.stack(torch.aminmax(t)).tolist()  # one device -> host transfer
    return float(hi) if hi != hi else float(max(hi, -lo))


def first_sum_over(limit: int, q, w, src, dst, *, n_nodes: int, n_agents: int = 1, centred: bool = True):
    """The first node whose neighbour-sum bound ``B_i = sum_j w_ij |q_j - q_i|`` reaches ``limit``
    (``centred=False``: ``sum_j w_ij |q_j|``, the masked protocol's decrypted sums).

    Float64 with a relative safety margin far above its rounding error. Returns ``None``
    when every bound fits, else ``(trial, agent, bound)``.
    """
    if not centred:
        diff = q[dst].to(torch.float64).abs()
    elif abs_max(q) < 2.0**62:  # int64 differences cannot overflow
        diff = (q[dst] - q[src]).to(torch.float64).abs()
    else:
        diff = (q[dst].to(torch.float64) - q[src].to(torch.float64)).abs()
    bound = torch.zeros((n_nodes,) + tuple(q.shape[1:]), dtype=torch.float64, device=q.device)
    bound.index_add_(0, src, w.to(torch.float64).reshape(-1, *([1] * (q.dim() - 1))) * diff)
    per_agent = bound.reshape(n_nodes, -1).amax(dim=1)
    bad = ~(per_agent < limit * (1 - 1e-9))
    if not bool(bad.any()):
        return None
    idx = int(torch.nonzero(bad)[0, 0])
    return (*_flat_to_trial_agent(idx, n_agents), float(per_agent[idx]))


@dataclass(frozen=True)
class IntegerCodec:
    """Fixed-point integer encoding of ``U`` and of the penalties.

    Parameters
    ----------
    n_max : float
        Quantization scale of the values (the paper's ``N_max``), ``>= 1``.
    g_bits : int
        Penalties are scaled by ``2^g_bits``.
    key_bits : int
        Paillier modulus size the range is derived from (the emulated path checks the
        same limit as the key it stands in for).
    """

    n_max: float = 1e6
    g_bits: int = 16
    key_bits: int = 2048

    def __post_init__(self):
        check_codec_params(self.n_max, self.g_bits, self.key_bits)

    # -- derived constants -------------------------------------------------------------
    @property
    def limit(self) -> int:
        """Exclusive bound on the magnitude of every plaintext integer."""
        return min(1 << (self.key_bits - 3), INT64_LIMIT)

    @property
    def value_scale(self) -> float:
        return float(self.n_max)

    @property
    def penalty_scale(self) -> float:
        return float(1 << self.g_bits)

    @property
    def sum_divisor(self) -> float:
        """``S = S_int / (n_max 4^s)``; exact in float64 for integer ``n_max < 2^(53-2s)``."""
        return float(self.n_max) * float(1 << (2 * self.g_bits))

    # -- encoding ----------------------------------------------------------------------
    def encode_values(self, U: torch.Tensor, *, n_agents: int = 1, bcd_iter=0, admm_iter=0, scratch=None,
                      out=None) -> torch.Tensor:
        """``q = round(n_max U)`` as int64, shape of ``U (A, ...)``; range-checked per agent.

        ``scratch`` (float64) and ``out`` (int64), contiguous and of ``U``'s shape, optional:
        reused buffers for the scaled values and for ``q`` (the same values either way).
        """
        # one tensor, rounded in place: at large sizes every fresh temporary costs its pages
        scaled = torch.mul(U.to(torch.float64), self.value_scale, out=scratch).round_()
        if scaled.numel():
            lo, hi = torch.aminmax(scaled.reshape(scaled.shape[0], -1), dim=1)
            mags = torch.maximum(hi, lo.neg_())  # max |value| per agent; NaN stays NaN
        else:
            mags = scaled.new_zeros(0)
        bad = ~(mags < self.limit)  # also catches NaN / Inf
        if bool(bad.any()):
            idx = int(torch.nonzero(bad)[0, 0])
            trial, agent = _flat_to_trial_agent(idx, n_agents)
            val = float(mags[idx])
            raise CodecRangeError(
                f"codec range: agent {agent} (trial {trial}) at BCD iteration {bcd_iter}, "
                f"ADMM iteration {admm_iter}: quantized value magnitude {val:.6g} "
                f"(= n_max * |U|) does not fit the codec limit {self.limit} (2^{self.limit.bit_length() - 1}) "
                f"for {self.key_bits}-bit keys; lower n_max or use larger keys",
                trial=trial, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter,
                value=int(val) if math.isfinite(val) else 0, limit=self.limit,
            )
        return scaled.to(torch.int64) if out is None else out.copy_(scaled)

    def encode_penalties(self, g: torch.Tensor) -> torch.Tensor:
        """``gamma = round(2^s g)`` as int64, shape ``(2E,)`` (range: :meth:`check_penalty_sums`)."""
        return torch.round(g.to(torch.float64) * self.penalty_scale).to(torch.int64)

    def check_penalty_sums(self, gamma: torch.Tensor, w: torch.Tensor, src: torch.Tensor, *, n_nodes: int,
                           n_agents: int = 1, bcd_iter: int = 0, admm_iter: int = 0) -> None:
        """Raise :class:`CodecRangeError` if an integer penalty is too large for its products
        ``w = gamma_ij gamma_ji`` (``gamma >= 2^31``: int64 would wrap them), or if some
        ``rho_int_i = sum_j w_ij``, decrypted (or emulated) as one value, reaches the limit.

        One host synchronization: a float64 screen with a wide margin, exact Python
        integers for the suspects. ``fit`` refuses penalty caps that could fail this before
        a run starts (:meth:`preflight`), so inside a run it only guards direct use.
        """
        if gamma.numel() == 0:
            return
        approx = torch.zeros(n_nodes, dtype=torch.float64, device=w.device).index_add_(0, src, w.to(torch.float64))
        gmax, rmax = torch.stack([gamma.abs().max().to(torch.float64), approx.max()]).tolist()
        if gmax < _GAMMA_LIMIT and rmax < self.limit * (1 - 1e-9):
            return
        where = "codec range: agent {} (trial {}) at BCD iteration {}, ADMM iteration {}: "
        if not gmax < _GAMMA_LIMIT:
            e = int(gamma.abs().argmax())
            trial, agent = _flat_to_trial_agent(int(src[e]), n_agents)
            raise CodecRangeError(
                where.format(agent, trial, bcd_iter, admm_iter)
                + f"a penalty quantizes to {int(gmax)} (= g * 2^{self.g_bits}), and products gamma_ij gamma_ji "
                f"of such penalties do not fit 2^62; lower g_bits or the penalty caps",
                trial=trial, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter, value=int(gmax),
                limit=int(_GAMMA_LIMIT),
            )
        wl, sl = w.tolist(), src.tolist()
        for node in torch.nonzero(approx >= self.limit * (1 - 1e-9)).flatten().tolist():
            val = sum(x for x, s in zip(wl, sl) if s == node)
            if val >= self.limit:
                trial, agent = _flat_to_trial_agent(node, n_agents)
                raise CodecRangeError(
                    where.format(agent, trial, bcd_iter, admm_iter)
                    + f"rho_i = sum_j gamma_ij gamma_ji = {val} does not fit the codec limit {self.limit} "
                    f"(2^{self.limit.bit_length() - 1}) for {self.key_bits}-bit keys; lower g_bits or the penalty "
                    "caps, or use larger keys",
                    trial=trial, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter, value=val, limit=self.limit,
                )

    def pair_weights(self, gamma: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
        """``gamma_ij gamma_ji`` per directed edge (int64, shape ``(2E,)``)."""
        return gamma * gamma[rev]

    def check_sums(self, q, w, src, dst, *, n_nodes, n_agents=1, bcd_iter=0, admm_iter=0) -> None:
        """Raise :class:`CodecRangeError` if some ``B_i = sum_j w_ij |q_j - q_i|`` reaches the limit.

        A cheap global bound is tried first; the exact per-agent bound runs only when
        the global one does not already prove every sum is in range.
        """
        if src.numel() == 0:
            return
        qmax = abs_max(q)
        deg = torch.bincount(src, minlength=n_nodes)
        crude = 2.0 * qmax * float(w.abs().max()) * float(deg.max())
        if crude < self.limit * (1 - 1e-9):
            return
        hit = first_sum_over(self.limit, q, w, src, dst, n_nodes=n_nodes, n_agents=n_agents)
        if hit is not None:
            trial, agent, val = hit
            raise CodecRangeError(
                f"codec range: agent {agent} (trial {trial}) at BCD iteration {bcd_iter}, "
                f"ADMM iteration {admm_iter}: neighbour sum bound {val:.6g} "
                f"(= sum_j gamma_ij gamma_ji |q_j - q_i|) does not fit the codec limit {self.limit} "
                f"(2^{self.limit.bit_length() - 1}) for {self.key_bits}-bit keys; lower n_max or g_bits, "
                f"or use larger keys",
                trial=trial, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter,
                value=int(val), limit=self.limit,
            )

    def preflight(self, *, value_scale: float, g_max: float, max_degree: int, headroom: float = 16.0,
                  g_min: float | None = None) -> None:
        """Fail before a run starts when the key is too small for ``n_max`` at this problem's scale,
        or when ``g_bits`` is too few for the penalty caps.

        The bound checked is the one :meth:`check_sums` enforces at every iteration,
        ``2 * n_max * |U| * gamma_max^2 * d_max``, evaluated with ``|U|`` taken as
        ``headroom * max(1, value_scale)`` (``value_scale``: a public bound on the exchanged values;
        PPDNMF passes its agreed start's, :data:`~ppdnmf_torch.models.ppdnmf.run.START_BOUND`). Iterates that still outgrow the range later raise
        :class:`CodecRangeError` at that iteration.

        ``g_min``, the smallest cap of an agent with neighbours, must quantize to at least 1:
        a cap of ``round(2^g_bits g_min) = 0`` makes every penalty of that agent 0, which
        silently switches its consensus off.

        Raises
        ------
        ConfigError
            Naming ``key_bits``, ``n_max`` and the smallest key size that would do; or
            ``g_bits`` and the smallest value that quantizes ``g_min`` to a nonzero integer.
        """
        if max_degree < 1:
            return
        if g_min is not None and round(float(g_min) * self.penalty_scale) < 1:
            # the smallest g_bits the codec takes whose round(g_min 2^b) is not 0 (round half
            # to even, as torch.round does)
            bits = next((b for b in range(MAX_G_BITS + 1) if round(float(g_min) * 2.0 ** b) >= 1), None)
            hint = (f"use {{g_bits}} >= {bits}" if bits is not None
                    else f"no {{g_bits}} up to {MAX_G_BITS} holds it: raise the caps")
            raise ConfigError(
                f"g_bits: with g_bits={self.g_bits}, the penalty cap {g_min:g} quantizes to 0 "
                f"(round({g_min:g} * 2^{self.g_bits})), so that agent's penalties would all be 0 and "
                f"its consensus switched off; {hint}"
            )
        gamma = round(float(g_max) * self.penalty_scale)
        if gamma < 1:
            return
        # in log2, so that no size of data or n_max overflows a float (1e300 * 1e300)
        log_need = (1 + math.log2(float(self.n_max)) + math.log2(headroom) + math.log2(max(1.0, float(value_scale)))
                    + 2 * math.log2(gamma) + math.log2(max_degree))
        if log_need >= math.log2(self.limit):
            bits_needed = math.ceil(log_need) + 3
            if log_need >= math.log2(INT64_LIMIT):
                fits = self.n_max * 2.0 ** (math.log2(self.limit) - log_need)
                hint = (f"the int64 emulation holds 2^62 at most, so lower {{n_max}} (or {{g_bits}}); "
                        f"{{n_max}} <= {fits:.3g} fits" if fits >= 1 else
                        f"the int64 emulation holds 2^62 at most, and no {{n_max}} >= 1 fits values of this scale "
                        f"({float(value_scale):.3g}) under these caps: lower {{g_bits}} or the penalty caps")
            else:
                hint = f"use {{key_bits}} >= {bits_needed} or lower {{n_max}}"
            raise ConfigError(
                f"key_bits/n_max: with n_max={self.n_max:g}, g_bits={self.g_bits} and penalty caps up to "
                f"{g_max:g}, neighbour sums can reach about 2^{log_need:.1f}, beyond the codec limit "
                f"2^{self.limit.bit_length() - 1} of {self.key_bits}-bit keys; {hint}"
            )

    # -- decoding (the one function every exchange kind goes through) -----------------
    def decode(self, S_int: torch.Tensor, rho_int: torch.Tensor, dtype=torch.float64, out=None):
        """``S = S_int / (n_max 4^s)`` and ``rho = rho_int / 4^s``.

        Parameters
        ----------
        S_int : int64 Tensor (A, L*K)
        rho_int : int64 Tensor (A,)
        dtype : torch dtype of the returned ``S``; ``rho`` is float64.
        out : Tensor (A, L*K) of ``dtype``, optional
            Receives ``S`` (the same values as a fresh tensor).
        """
        if out is not None and out.dtype == torch.float64:
            S = out.copy_(S_int).div_(self.sum_divisor)
        else:
            S = S_int.to(torch.float64, copy=True).div_(self.sum_divisor).to(dtype)
            S = S if out is None else out.copy_(S)
        return S, self.decode_rho(rho_int)

    def decode_rho(self, rho_int: torch.Tensor) -> torch.Tensor:
        return rho_int.to(torch.float64) / float(1 << (2 * self.g_bits))

    # -- python-int helpers for the host path ------------------------------------------
    def to_residue(self, v: int, n: int) -> int:
        """Signed integer -> residue mod ``n`` (negatives as ``v + n``)."""
        return v % n

    def from_residue(self, r: int, n: int) -> int:
        """Residue mod ``n`` -> signed integer; raises if it lies outside ``(-limit, limit)``."""
        v = r if r <= n // 2 else r - n
        if not -self.limit < v < self.limit:
            raise CodecRangeError(
                f"codec range: decrypted value {v} lies outside (-{self.limit}, {self.limit}); "
                "the plaintext wrapped modulo n", value=abs(v), limit=self.limit,
            )
        return v
