"""``fit_fsspca``: FSSPCA (Algorithm 1) from the workers' row blocks, batched over trials,
with the secure (or plain) aggregation, histories, a callback and checkpoints.

This is the function the estimator and the app call; the maths lives in :mod:`.admm`,
:mod:`.manifold` and :mod:`.smoothing`.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import budget
from ..._utils import ARRAY, CALLBACK, OPTIONS, derive_seed, resolve_device, resolve_dtype
from ...checkpoint import digest
from ...driver import Checkpoints, Ledgers, Resources, check_checkpoint_args, drive
from ...errors import ConfigError, DataError
from ...exchange.aggregation import make_aggregator
from ...specs import check_call
from . import admm
from .centring import aggregate, centred_gram, global_mean, worker_sums
from .config import ALPHA_SCALES, RHO_RULES, RUN, SPEC, TASK
from .data import check_rows
from .manifold import qf
from .result import HISTORY_KEYS, FSSPCAResult
from .server_host import HostServerRun, choose_plan
from .server_run import ServerRun
from .smoothing import get_smoothing

__all__ = ["fit_fsspca", "as_blocks", "prepare_problem", "worker_rho", "per_trial", "initial_z", "auto_rho"]

# the defaults (docs/FSSPCA.md says how each was chosen) and ``rho``'s rules: .config (FSSPCASpec)


def as_blocks(data, groups=None, *, device=None, dtype=None):
    """The workers' row blocks as a list of ``(n_i, d)`` tensors on one device and dtype.

    ``data`` is a list of arrays (one per worker), or one ``(n, d)`` array with ``groups``
    (``(n,)`` worker labels; workers are the sorted distinct labels), or the pair
    ``(A, groups)``. ``device``/``dtype`` None follow the input (NumPy in: CPU, float64
    unless the input is float32).
    """
    if isinstance(data, tuple) and len(data) == 2 and groups is None:
        data, groups = data
    if groups is not None:
        A = _as_tensor(data, "data")
        if A.dim() != 2:
            raise DataError(f"data: expected a 2-D array with groups, got shape {tuple(A.shape)}")
        g = np.asarray(groups.cpu() if isinstance(groups, torch.Tensor) else groups)
        if g.shape != (A.shape[0],):
            raise DataError(f"groups: expected one label per row ({A.shape[0]}), got shape {g.shape}")
        labels = np.unique(g)
        data = [A[torch.as_tensor(np.flatnonzero(g == lab), device=A.device)] for lab in labels]
    if not isinstance(data, (list, tuple)) or len(data) == 0:
        raise DataError("data: expected a non-empty list of row blocks, or an array with groups")
    blocks = [_as_tensor(b, f"data[{i}]") for i, b in enumerate(data)]
    dev = resolve_device(device) if device is not None else blocks[0].device
    dt = resolve_dtype(dtype) if dtype is not None else (
        blocks[0].dtype if blocks[0].dtype in (torch.float32, torch.float64) else torch.float64)
    out = []
    for i, b in enumerate(blocks):
        if b.dim() != 2:
            raise DataError(f"data[{i}]: expected a 2-D (n_i, d) block, got shape {tuple(b.shape)}")
        if b.shape[0] == 0:
            raise DataError(f"data[{i}]: worker {i} holds no rows")
        if b.shape[1] != blocks[0].shape[1]:
            raise DataError(f"data[{i}]: {b.shape[1]} features, worker 0 has {blocks[0].shape[1]}")
        b = b.to(device=dev, dtype=dt)
        if not _finite(b):
            raise DataError(f"data[{i}]: contains NaN or infinity")
        out.append(b)
    return out


def _finite(b: torch.Tensor) -> bool:
    """Whether every entry is finite (NumPy's test on a CPU float tensor: the same answer, a
    fraction of torch's time on large blocks)."""
    if b.device.type == "cpu" and b.dtype in (torch.float32, torch.float64) and not b.requires_grad:
        return bool(np.isfinite(b.numpy()).all())
    return bool(torch.isfinite(b).all())


def _as_tensor(x, what):
    if isinstance(x, torch.Tensor):
        return x
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - numpy's own message says why
        raise DataError(f"{what}: not an array ({exc})") from None
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
        raise DataError(f"{what}: expected numbers, got dtype {arr.dtype}")
    return torch.from_numpy(np.ascontiguousarray(arr))


def prepare_problem(blocks, n_trials=1, *, center=True, aggregation="plain", projector=None):
    """The Gram-only problem of the workers' blocks (each computes its own ``C_i``), centred
    through the aggregator when ``center``; returns ``(FSSPCAProblem, mean or None)``."""
    # both plans take torch's C_i: the penalties made from it are settings a checkpoint compares,
    # so a run resumes across the plans (NumPy's A^T A took about half the time here)
    gram = torch.stack([b.transpose(0, 1) @ b for b in blocks])
    sqnorm = torch.stack([b.square().sum() for b in blocks])
    s, n = worker_sums(blocks)
    mean = None
    if center:
        mean = global_mean(s, n, aggregation)
        gram, sqnorm = centred_gram(gram, sqnorm, s, n, mean)
    T = n_trials
    if projector is not None:
        # Algorithm 4: the same problem on the data A_i G (Gram G C_i G for a symmetric G)
        gram = projector[:, None] @ gram @ projector[:, None]
        sqnorm = torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1)
        return admm.FSSPCAProblem(gram, sqnorm, n.expand(T, *n.shape), projector), mean
    return admm.FSSPCAProblem(gram.expand(T, *gram.shape), sqnorm.expand(T, *sqnorm.shape),
                              n.expand(T, *n.shape), projector), mean


def per_trial(x, T, name, like):
    t = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    if t.dim() == 0:
        t = t.expand(T)
    if t.shape != (T,):
        raise ConfigError(f"{name}: expected a number or {T} values (one per trial), got shape {tuple(t.shape)}")
    if bool((t < 0).any()) or not bool(torch.isfinite(t).all()):
        raise ConfigError(f"{name}: must be finite and >= 0, got {x}")
    return t.clone()


def initial_z(n_features, r, T, seed, init, dtype, device):
    if init is not None:
        z0 = torch.as_tensor(init, dtype=dtype, device=device)
        if z0.dim() == 2:
            z0 = z0.expand(T, *z0.shape)
        if z0.shape != (T, n_features, r):
            raise ConfigError(f"init: expected shape ({n_features}, {r}) or ({T}, {n_features}, {r}), "
                              f"got {tuple(z0.shape)}")
        return qf(z0.clone())
    # each trial its own stream, so that a trial gives the same start in any batch
    draws = [torch.randn((n_features, r), generator=torch.Generator().manual_seed(derive_seed(seed, "fsspca", t)),
                         dtype=torch.float64) for t in range(T)]
    return qf(torch.stack(draws).to(device=device, dtype=dtype))


def auto_rho(problem, scale, aggregation="plain"):
    """``rho = "auto"``: ``scale`` times the workers' mean largest eigenvalue of ``C_i``, one
    penalty per trial ``(T,)``; each worker's ``lambda_max(C_i)`` is one number of the
    aggregation's round (a secure kind: the server learns only their sum)."""
    # the local subproblem (14) is then strongly convex near the manifold (rho > 2 ||C_i||)
    # for workers of average size
    lam = torch.linalg.eigvalsh(problem.gram[:, :, :, :]).amax(dim=-1)
    if isinstance(aggregation, str):
        return scale * lam.mean(dim=1)
    return scale * aggregate(aggregation, lam, 0) / lam.shape[1]


def check_alpha_scale(alpha_scale):
    if alpha_scale not in ALPHA_SCALES:
        raise ConfigError(f"alpha_scale: expected one of {list(ALPHA_SCALES)}, got {alpha_scale!r}")


def alpha_unit(problem, alpha_scale, aggregation="plain"):
    """What ``alpha`` multiplies, ``(T,)``: 1 (``"none"``) or ``sum_i lambda_max(C_i)`` (``"gram"``:
    the workers' largest eigenvalues through the aggregation, as ``rho="auto"`` sums them, so the
    server learns no more than it does for ``rho``)."""
    if alpha_scale == "none":
        return torch.ones(problem.gram.shape[0], dtype=problem.gram.dtype, device=problem.gram.device)
    return auto_rho(problem, 1.0, aggregation) * problem.gram.shape[1]


def worker_rho(problem, scale):
    """``rho = "worker"``: each worker its own penalty ``rho_i = scale lambda_max(C_i)``, ``(T, K)``.

    A worker needs only its own Gram matrix for it; the server's z-step needs their sum
    (:func:`.admm.upload`), one secure sum at the start (docs/FSSPCA.md, "rho").
    """
    return scale * torch.linalg.eigvalsh(problem.gram).amax(dim=-1)


def fit_fsspca(data, n_components, *, groups=None, alpha=TASK.alpha, lambda_2=SPEC.lambda_2, smoothing=SPEC.smoothing,
               mu=SPEC.mu, rho=SPEC.rho, rho_scale=SPEC.rho_scale, line_search=SPEC.line_search,
               inner_steps=SPEC.inner_steps, local_solver=SPEC.local_solver,
               aggregation=SPEC.aggregation, aggregation_options=None,
               center=SPEC.center, alpha_scale=SPEC.alpha_scale, max_iter=SPEC.max_iter, tol=SPEC.tol,
               trials=RUN.trials, seed=RUN.seed, init=SPEC.init, device=None, dtype=None, callback=None,
               checkpoint_dir=None,
               checkpoint_every=RUN.checkpoint_every, resume=False, projector=None, plan="auto") -> FSSPCAResult:
    """Federated sparse PCA (Algorithm 1): sparse loadings of the workers' pooled rows.

    Parameters
    ----------
    data : list of array (n_i, d), or array (n, d) with ``groups``, or ``(A, groups)``
        The workers' row blocks (one per worker; row counts may differ).
    n_components : int
        ``r``, the number of loadings.
    alpha : float or sequence (T,)
        ``lambda_1``, the weight of ``||z||_1`` (per trial when a sequence).
    lambda_2 : float, sequence (T,) or None
        Weight of the smooth term ``r(w_i)`` of each worker; None follows ``alpha``:
        ``lambda_2 = lambda_1 / K``, so that the consensus point pays ``lambda_1 (||z||_1 + r(z))``
        whatever ``K`` (docs/FSSPCA.md). ``0`` is Tan et al.'s unsmoothed ADMM.
    smoothing : {"sqrt", "huber", "logexp", "erf"}
        ``psi_mu`` (:mod:`.smoothing`).
    mu : float
        The smoothing parameter (the paper's ``1e-3``).
    rho : float, sequence (T,), "auto" or "worker"
        The ADMM penalty. ``"auto"``: one penalty, ``rho_scale`` times the workers' mean
        ``lambda_max(C_i)`` (that mean is taken in the clear here, not through ``aggregation``);
        ``"worker"``: each worker its own ``rho_i = rho_scale lambda_max(C_i)`` (:func:`worker_rho`;
        the z-step weighs the uploads by ``rho_i``, their mean one secure sum at the start).
        docs/FSSPCA.md, "rho".
    line_search : {"armijo", "wolfe"}
        The Riemannian solver's line search.
    inner_steps : int
        Local steps per worker per ADMM iteration.
    local_solver : {"polar", "riemannian"}
        A worker's step (14): majorize-minimize polar steps (:mod:`.polar`; docs/FSSPCA.md, "The
        polar step") or the paper's Riemannian steepest descent with ``line_search``.
    aggregation : {"plain", "quantized", "paillier", "secagg"} or an aggregator
        How the server gets the sum of the workers' uploads (``sum_i (w_i + u_i/rho)``, or
        with per-worker ``rho_i`` :func:`.admm.upload`), the centring sums and the mean ``rho_i``: the paper's plain
        upload, or a secure sum (:func:`ppdnmf_torch.exchange.aggregation.make_aggregator`, made
        here with ``aggregation_options`` and closed at the end; an aggregator handed in is used
        as it is and left open). Its counted costs are ``result.costs`` (a resumed run's continue
        the checkpoint's; its setup, the centring's rounds, is counted again).
    aggregation_options : dict, optional
        Passed to ``make_aggregator`` (``n_max``, ``key_bits``, ``seed``, ``keypairs``, ...).
    center : bool
        Centre the pooled data with the global mean, itself a secure sum (:mod:`.centring`).
    alpha_scale : {"none", "gram"}
        ``"gram"``: ``lambda_1 = alpha sum_i lambda_max(C_i)`` (:func:`alpha_unit`), so one ``alpha``
        gives the same sparsity at any scale of the data (the estimator's rule); ``"none"``:
        ``lambda_1 = alpha``.
    max_iter : int
    tol : float
        A trial stops when the RMS consensus gap ``sqrt(sum_i ||w_i - z||^2 / (K r))`` and the
        change of ``z`` per column ``||z - z_old|| / sqrt(r)`` are both ``<= tol``.
    trials : int
        ``T`` trials batched in one computation, each with its own start (``seed``, trial).
    seed : int
    init : None, "pca", array (d, r) or (T, d, r)
        The common start ``z = w_i`` (orthonormalized). None: random, per trial from
        ``(seed, trial)``. ``"pca"``: the top ``r`` eigenvectors of the pooled Gram matrix, summed
        through the aggregator in one extra round (whoever holds the aggregate learns the pooled
        ``A^T A``: more than the z-step reveals).
    device, dtype : optional
        Default: the input's.
    callback : callable, optional
        ``callback(IterationInfo)`` after each iteration; returning True stops the run.
    checkpoint_dir : path, optional
        Checkpoints (the engine's format, :mod:`ppdnmf_torch.checkpoint`) every
        ``checkpoint_every`` iterations (0: only at the end), at the end and on Ctrl-C (then
        :class:`~ppdnmf_torch.driver.RunInterrupted`); the newest two are kept. The folder is
        locked: a second run into it is refused, as is a fresh run into another run's checkpoints.
    resume : bool
        Continue from the newest checkpoint in ``checkpoint_dir`` (none: a fresh start), bit for
        bit; changed settings or data are refused by name (only ``max_iter`` may change).
    projector : Tensor (d, d) or (T, d, d), optional
        Deflation's ``G`` (use :func:`.deflation.fit_deflated`).
    plan : {"auto", "torch", "host"}
        How the iterations run, chosen once for the fit (:func:`.server_host.choose_plan`):
        ``"torch"`` on tensors on the data's device; ``"host"`` (the polar local solver on CPU
        float tensors) on NumPy arrays, faster on the CPU (docs/PERFORMANCE.md); the same numbers
        up to rounding, and a checkpoint of one resumes in the other. ``"auto"`` (default): the
        host plan where it applies, the torch plan otherwise. The result's ``plan`` says which ran.

    Returns
    -------
    FSSPCAResult
    """
    # an aggregator handed in is anything with total() (a kind's name: the spec's rule); checkpoint_every:
    # check_checkpoint_args's, as every model's; smoothing: a name or a Smoothing, get_smoothing's
    check_call(locals(), SPEC, TASK, RUN, arrays=("alpha", "lambda_2", "rho"),
               skip=("checkpoint_every", "smoothing") + (() if isinstance(aggregation, str) else ("aggregation",)),
               also={"aggregation_options": OPTIONS, "init": ARRAY | str, "callback": CALLBACK, "projector": ARRAY,
                     "plan": str})
    if not isinstance(aggregation, str) and not callable(getattr(aggregation, "total", None)):
        raise ConfigError(f"aggregation: must be a kind's name or an aggregator (an object with total()), got "
                          f"{aggregation!r} ({type(aggregation).__name__})")
    blocks = as_blocks(data, groups, device=device, dtype=dtype)
    K, d = len(blocks), blocks[0].shape[1]
    like = blocks[0]
    r, T = _check_counts(n_components, d, trials, max_iter, tol)
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    check_rows(blocks, center=center)
    budget.check(budget.fsspca(n=sum(int(b.shape[0]) for b in blocks), d=d, n_workers=K, n_components=r, trials=T,
                               max_iter=int(max_iter), dtype=like.dtype, device=like.device))
    psi = get_smoothing(smoothing)
    admm.check_settings(line_search, inner_steps, mu, local_solver, psi)
    if projector is not None:
        projector = torch.as_tensor(projector, dtype=like.dtype, device=like.device)
        projector = projector.expand(T, d, d) if projector.dim() == 2 else projector
    check_alpha_scale(alpha_scale)
    chosen = choose_plan(plan, like, local_solver)
    o = dict(center=center, alpha=alpha, alpha_scale=alpha_scale, lambda_2=lambda_2, psi=psi, mu=mu, rho=rho, rho_scale=rho_scale,
             line_search=line_search, inner_steps=int(inner_steps), local_solver=local_solver, tol=tol, seed=seed, init=init,
             max_iter=int(max_iter), plan=chosen)
    return _run(blocks, r, T, aggregation, aggregation_options, projector, o, callback,
                dict(checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume))


def _check_counts(n_components, d, trials, max_iter, tol) -> tuple:
    """``(r, T)``, the counts checked (one ``ConfigError`` naming the first bad one)."""
    r = int(n_components)
    if not 1 <= r <= d:
        raise ConfigError(f"n_components: must be in 1..{d} (the number of features), got {n_components}")
    T = int(trials)
    if T < 1:
        raise ConfigError(f"trials: must be >= 1, got {trials}")
    if int(max_iter) < 1:
        raise ConfigError(f"max_iter: must be >= 1, got {max_iter}")
    if not tol >= 0:
        raise ConfigError(f"tol: must be >= 0, got {tol}")
    return r, T


def _run(blocks, r, T, aggregation, aggregation_options, projector, o: dict, callback, ckpt: dict) -> FSSPCAResult:
    """The run of :func:`fit_fsspca` on the driver, its aggregator made (and closed) here when
    named; ``ckpt``: the checkpoint arguments."""
    K = len(blocks)
    with Resources() as res:
        if isinstance(aggregation, str):
            if aggregation == "secagg" and K < 2 and not aggregation_options:
                aggregation = "plain"  # one worker: the sum is its upload whatever the protocol (secagg needs 2)
            aggregation = res.own(make_aggregator(aggregation, K, **(aggregation_options or {})))
        run, mean, settings = _server_run(blocks, r, T, aggregation, projector, o)
        plan = None if ckpt["checkpoint_dir"] is None else Checkpoints(
            ckpt["checkpoint_dir"], every=ckpt["checkpoint_every"], resume=ckpt["resume"], device=blocks[0].device)
        ledgers = Ledgers(aggregation=aggregation)
        out = drive(run, max_iter=o["max_iter"], tol=o["tol"], callback=callback, checkpoints=plan, ledgers=ledgers)
        costs = ledgers.costs("aggregation")
    return _result(run, out, mean, settings, costs, projector, o["plan"])


def _server_run(blocks, r, T, aggregation, projector, o: dict) -> tuple:
    """The model of a run (the workers' (centred) Gram matrices, the penalties, the start), the global
    mean (None without centring) and the run's settings as the result reports them."""
    K, d, like = len(blocks), blocks[0].shape[1], blocks[0]
    init, rho = o["init"], o["rho"]
    init_kind = init if isinstance(init, str) else (None if init is None else "given")
    problem, mean = prepare_problem(blocks, T, center=o["center"], aggregation=aggregation, projector=projector)
    lam1 = per_trial(o["alpha"], T, "alpha", like) * alpha_unit(problem, o["alpha_scale"], aggregation)
    lam2 = lam1 / K if o["lambda_2"] is None else per_trial(o["lambda_2"], T, "lambda_2", like)
    if isinstance(rho, str):
        if rho not in RHO_RULES:
            raise ConfigError(f"rho: expected a positive number or one of {list(RHO_RULES)}, got {rho!r}")
        rho_t = (worker_rho(problem, o["rho_scale"]) if rho == "worker"
                 else auto_rho(problem, o["rho_scale"], aggregation))
    else:
        rho_t = per_trial(rho, T, "rho", like)
    if not bool((rho_t > 0).all()):
        raise ConfigError(f"rho: must be > 0, got {rho}")
    # each worker its own rho_i: the server's z-step needs their mean, one secure sum at the start
    rho_bar = aggregate(aggregation, rho_t, 0) / K if rho_t.dim() == 2 else rho_t
    settings = dict(n_components=r, alpha=lam1.tolist(), lambda_2=lam2.tolist(), smoothing=o["psi"].name, mu=o["mu"],
                    rho=rho if isinstance(rho, str) else rho_t.tolist(), rho_scale=o["rho_scale"],
                    rho_mean=rho_bar.tolist(), line_search=o["line_search"], inner_steps=o["inner_steps"],
                    local_solver=o["local_solver"],
                    center=o["center"], max_iter=o["max_iter"], tol=o["tol"], trials=T, seed=o["seed"], n_workers=K,
                    aggregation=getattr(aggregation, "kind", type(aggregation).__name__))
    if isinstance(init, str):
        if init != "pca":
            raise ConfigError(f"init: expected 'pca', an array or None, got {init!r}")
        # the pooled Gram matrix through the aggregator (one more round: its holder learns the
        # pooled covariance, d x d numbers, more than the z-step's sums), then its top r eigenvectors
        # (deflation: the projected Grams differ per trial)
        pooled_c = aggregate(aggregation, problem.gram[0] if problem.projector is None else problem.gram, 2)
        init = torch.linalg.eigh(pooled_c)[1][..., -r:].flip(-1).expand(T, d, r)
    z0 = initial_z(d, r, T, o["seed"], init, like.dtype, like.device)
    if projector is not None:
        z0 = qf(projector @ z0)
    # first trial step: 1 / (the local curvature's scale) per worker
    scale = 2.0 * torch.linalg.matrix_norm(problem.gram) + admm._rho2(rho_t) + lam2[:, None] / o["mu"]
    state = admm.ADMMState(w=z0[:, None].expand(T, K, d, r).clone(), u=torch.zeros((T, K, d, r), dtype=like.dtype,
                           device=like.device), z=z0, theta=1.0 / scale)
    checked = {k: v for k, v in settings.items() if k not in ("max_iter", "aggregation")}
    checked.update(init=init_kind or "random", aggregation=_arithmetic(aggregation))
    settings["init"] = "random" if init_kind is None else init_kind
    run_class = HostServerRun if o["plan"] == "host" else ServerRun
    run = run_class(problem, state, aggregation, lam1=lam1, lam2=lam2, rho=rho_t, rho_bar=rho_bar, smoothing=o["psi"],
                    mu=o["mu"], line_search=o["line_search"], inner_steps=o["inner_steps"],
                    local_solver=o["local_solver"], tol=o["tol"],
                    settings=checked, inputs=lambda: {"data": digest(problem.gram, problem.sqnorm),
                                                      "projector": digest(projector), "start": digest(z0)})
    return run, mean, settings


def _arithmetic(aggregation):
    """The sums' arithmetic: ``plain`` (None) or the integer kinds' ``n_max`` (``quantized`` and
    ``paillier`` give the same bits)."""
    kind = getattr(aggregation, "kind", "plain")
    return None if kind == "plain" else float(getattr(aggregation, "n_max", 0.0))


def _result(run, out, mean, settings: dict, costs: dict, projector, plan: str) -> FSSPCAResult:
    st, T = run.st, run.st.z.shape[0]
    zf = st.z if projector is None else projector @ st.z
    var = admm.adjusted_variance_components(run.pooled, st.z)
    total_var = torch.diagonal(run.pooled, dim1=-2, dim2=-1).sum(-1)
    return FSSPCAResult(z=st.z, components=qf(zf), w=st.w, u=st.u, n_iter=run.n_iter, converged=run.converged_trials,
                        history=_stack(out.history, T, st.z), mean=mean, explained_variance=var.sum(-1) / total_var,
                        variance_components=var, total_variance=total_var, settings=settings, costs=costs,
                        line_search=dict(evals=st.line_search_evals, failures=st.line_search_failures), plan=plan)


def _stack(history, T, like):
    return {k: torch.stack(history[k]) if history.get(k) else torch.zeros((0, T), dtype=like.dtype, device=like.device)
            for k in HISTORY_KEYS}
