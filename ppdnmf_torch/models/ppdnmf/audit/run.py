"""The audit itself: the named scenarios and :func:`run_audit`, which records each one,
runs both adversaries on it and assembles the report (a JSON-ready dict).
"""
from __future__ import annotations

import platform
import time

import numpy as np
import torch

from ....errors import ConfigError
from ....audit.eavesdropper import SIGNIFICANT, eavesdropper_paillier, eavesdropper_plain
from ....audit.across_calls import difference_attack
from ....audit.masked import CONFIDENCE_Z, collusion_audit, masked_ciphertext_audit, record_seeds, tag_seeds
from ....audit.secagg import record_secagg_seeds, secagg_message_audit
from ....audit.neighbour import decrypt_each_check, neighbour_audit
from .record import record_fit
from ....audit.report import BEATS_BASELINE_RATIO, DIRECTION_CORR, EXACT_FRACTION, collect_flags
from ....audit.sums import public_x_max, schedule_audit, sums_audit

__all__ = ["run_audit", "fitting_n_max", "SCENARIOS", "ALL_SCENARIOS"]

#: the scenarios :func:`run_audit` runs by default
SCENARIOS = ("paper_synthetic", "star", "random_caps", "short_admm")
#: every scenario it knows by name (``ring``: the paper's data on a ring, every agent of degree 2)
ALL_SCENARIOS = SCENARIOS + ("ring",)
#: the codec scales :func:`fitting_n_max` tries, largest first
N_MAX_STEPS = (1e6, 5e5, 2e5, 1e5, 5e4, 2e4, 1e4)


def _scenario(name: str, seed: int):
    """``(blocks, graph, g_max, solver, overrides)`` of a named scenario (``overrides``: fit
    keywords that take precedence over :func:`run_audit`'s iteration counts)."""
    from ..experiments import PAPER_EXPERIMENTS, make_trial
    from ....graph import ring, star

    spec = PAPER_EXPERIMENTS["paper_synthetic"]
    blocks, graph = make_trial(spec, seed)
    solver = {k: getattr(spec.solver, k) for k in ("rank", "mu", "eta", "g_max", "bcd_iters", "x_iters", "y_iters")}
    g_max = solver.pop("g_max")
    if name == "paper_synthetic":
        return blocks, graph, g_max, solver, {}
    if name == "star":
        return blocks, star(len(blocks)), g_max, solver, {}
    if name == "ring":
        return blocks, ring(len(blocks)), g_max, solver, {}
    if name == "short_admm":
        # 3 ADMM iterations per X-step: the penalty draws are still moving when the first
        # informative messages (BCD iteration 2) go out
        return blocks, graph, g_max, solver, {"x_iters": 3}
    if name == "random_caps":
        # private, different caps: each agent's g_i uniform in [0.5, 1.5] x the paper's
        gen = torch.Generator().manual_seed(int(seed) + 7919)
        caps = (g_max * (0.5 + torch.rand(len(blocks), generator=gen, dtype=torch.float64))).tolist()
        # unequal caps need a per-agent schedule (the default, agreed, takes one cap): the
        # earlier default's, under which this scenario was measured
        return blocks, graph, caps, solver, {"penalty_schedule": "adaptive"}
    raise ConfigError(f"scenario: unknown scenario {name!r}; use one of {ALL_SCENARIOS}")


def fitting_n_max(blocks, graph, g_max, *, g_bits: int = 16, key_bits: int = 128,
                  penalty_schedule: str | None = None, init: str | None = None) -> float:
    """The largest of :data:`N_MAX_STEPS` whose codec range holds the scenario under its penalty
    schedule (the check ``fit`` makes before a run, :func:`~..run.preflight`: the caps' largest
    reachable values, ``penalty_schedule="adaptive"`` lets them grow 32-fold, so ``n_max = 1e6`` does
    not fit every scenario that the paper's schedule fits; the exchanged values bounded by the start's,
    ``init``, default the library's). ``blocks`` is unused (the data's scale does not enter)."""
    from ..config import SOLVER_DEFAULTS
    from ..run import START_BOUND
    from ....exchange.codec import IntegerCodec
    from ....penalties import cap_bounds

    schedule = penalty_schedule or SOLVER_DEFAULTS.penalty_schedule
    caps = torch.as_tensor(np.broadcast_to(np.asarray(g_max, dtype=np.float64), (graph.n_agents,)).copy())
    highest = cap_bounds(caps, schedule)
    start = START_BOUND[init or SOLVER_DEFAULTS.init]
    deg = graph.degree
    for n_max in N_MAX_STEPS:
        try:
            IntegerCodec(n_max=n_max, g_bits=g_bits, key_bits=key_bits).preflight(
                value_scale=start, g_max=float(highest.max()), max_degree=int(deg.max()))
        except ConfigError:
            continue
        return n_max
    raise ConfigError(f"n_max: no scale down to {N_MAX_STEPS[-1]:g} fits {key_bits}-bit keys with g_bits={g_bits} "
                      f"under penalty_schedule={schedule!r}; pass n_max and g_bits explicitly")


def _graph_info(graph) -> dict:
    return {"n_agents": int(graph.n_agents), "edges": [list(e) for e in graph.edges],
            "degree": graph.degree.tolist()}


def _make_keypairs(bits: int, count: int) -> list:
    """``count`` Paillier key pairs with distinct moduli (the audit's own, small keys)."""
    from ....exchange.paillier import generate_keypairs

    return generate_keypairs(bits, count)


def _penalty_schedule(rec) -> dict:
    """When the integer penalties reach their final values, relative to the informative calls."""
    info = (rec.q[:, rec.dst] != rec.q[:, rec.src]).any(-1)
    sat = rec.gamma == rec.gamma[-1][None]
    return {
        "first_informative_bcd_iter": int(rec.bcd[info.any(1)].min()) if info.any() else None,
        "saturated_fraction_informative": float(sat[info].mean()) if info.any() else None,
        "saturated_from_call": int(np.argmax(sat.all(1))) + 1 if sat.all(1).any() else None,
        "distinct_final_gammas": sorted({int(v) for v in rec.gamma[-1]}),
    }


def _resolve_scenario(sc, seed: int):
    """``(name, blocks, graph, g_max, solver, overrides)`` of a named or a given scenario."""
    if isinstance(sc, str):
        return (sc, *_scenario(sc, seed))
    name, blocks, graph, g_max, *rest = sc
    from ....graph import Graph
    from ..problem import as_graph

    graph = graph if isinstance(graph, Graph) else as_graph(graph)
    solver = dict(rest[0]) if rest else {}
    return name, blocks, graph, g_max, solver, {}


def _masked_real(name, blocks, graph, rank, fit_kw, codec, bcd_iters: int, say) -> dict:
    """A real Paillier run of the scenario under ``protocol="masked"`` (the audit makes the keys
    and watches the seeds), every reply decrypted on its own: :func:`~.masked.masked_ciphertext_audit`,
    and the transcript scanned for every plaintext and every seed."""
    kw = dict(fit_kw, bcd_iters=bcd_iters)
    say(f"[{name}] real Paillier run, protocol=masked, {codec['key_bits']}-bit keys ({bcd_iters} BCD x "
        f"{kw['x_iters']} ADMM iterations), each reply decrypted on its own")
    t0 = time.perf_counter()
    keys = _make_keypairs(codec["key_bits"], graph.n_agents)
    with record_seeds() as drawn:
        rec = record_fit(blocks, graph, rank, kind="paillier", protocol="masked", **codec, keypairs=keys,
                         paillier_options={"workers": 0}, **kw)
    seeds, plan = tag_seeds(rec, drawn)
    out = masked_ciphertext_audit(rec, keys, seeds, plan)
    ev = eavesdropper_paillier(rec, seeds=list(seeds.values()))
    out["scan"] = {k: ev["scan"][k] for k in ("n_hits", "unobfuscated", "repeated_ciphertexts", "n_plaintexts",
                                              "n_seeds", "n_messages", "clean")}
    out["iterations"] = {"bcd_iters": bcd_iters, "x_iters": kw["x_iters"], "calls": rec.n_calls}
    del keys, seeds, drawn
    out["seconds"] = time.perf_counter() - t0
    return out


def _secagg_real(name, blocks, graph, rank, fit_kw, codec, schedule, sums, sums_max_calls, say) -> dict:
    """A run of the scenario under ``exchange="secagg"`` (the audit watches the seeds being derived), and
    the library's attacks on its recording: the curious receiver (``neighbour_audit``), the integer and
    lattice attacks on its sums, two colluding neighbours, the messages on the wire
    (:func:`~ppdnmf_torch.audit.secagg.secagg_message_audit`) and the adversary across calls
    (:func:`~ppdnmf_torch.audit.across_calls.difference_attack`). A schedule with per-edge weights is
    refused by the kind: the entry says so."""
    from ....exchange.secagg.exchange import unequal_weights_message

    if schedule != "agreed":
        return {"refused": str(ConfigError(unequal_weights_message(f"penalty_schedule={schedule!r} draws a weight "
                                                                   "per edge")))}
    say(f"[{name}] secagg run ({fit_kw['bcd_iters']} BCD x {fit_kw['x_iters']} ADMM iterations), its messages "
        "and sums attacked")
    t0 = time.perf_counter()
    with record_secagg_seeds() as seeds:
        rec = record_fit(blocks, graph, rank, kind="secagg", n_max=codec["n_max"], g_bits=codec["g_bits"], **fit_kw)
    out = {"neighbour": neighbour_audit(rec, "secagg")["summary"], "collusion": collusion_audit(rec)["summary"],
           "messages": secagg_message_audit(rec, seeds), "across_calls": difference_attack(rec)["summary"],
           "fit": {"nmse": rec.nmse, "consensus": rec.consensus}, "calls": rec.n_calls}
    del seeds
    if sums:
        x_max = public_x_max(fit_kw["g_max"], codec["g_bits"], schedule)
        out["sums"] = sums_audit(rec, x_max=x_max, max_calls=sums_max_calls)["by_degree"]
    out["seconds"] = time.perf_counter() - t0
    return out


def _to_stop(name, blocks, graph, rank, fit_kw, codec, cap: int, say) -> dict:
    """The adversary across calls on the scenario's run under its real stopping rule: ``fit``'s
    ``tol`` (the scenario's settings otherwise), up to ``cap`` BCD iterations, recorded on the integer
    protocol (``quantized``: the integers ``secagg`` and ``paillier`` exchange) and attacked over every
    call (:func:`~ppdnmf_torch.audit.across_calls.difference_attack`: any call at which exactly one
    neighbour's value moved, the calls at which the stopping rule held the others still among them)."""
    from ..config import SOLVER_DEFAULTS

    kw = dict(fit_kw, bcd_iters=int(cap))
    kw.setdefault("tol", SOLVER_DEFAULTS.tol)
    say(f"[{name}] the adversary across calls on a run to its stop (tol={kw['tol']:g}, at most {cap} BCD "
        f"x {kw['x_iters']} ADMM iterations)")
    t0 = time.perf_counter()
    rec = record_fit(blocks, graph, rank, kind="quantized", **codec, **kw)
    done = int(rec.bcd.max())
    out = difference_attack(rec)["summary"]
    out.update(tol=float(kw["tol"]), cap=int(cap), bcd_iters_run=done, stopped=bool(kw["tol"] > 0 and done < cap),
               calls=int(rec.n_calls), seconds=time.perf_counter() - t0)
    return out


def _audit_scenario(sc, *, seed, iters: dict, codec: dict, protocols, plain: bool, say,
                    masked_real=None, settings=None, sums=True, sums_max_calls=None,
                    secagg=True, to_stop=None) -> tuple[str, dict]:
    """``(name, entry)``: one scenario recorded on the integer protocol, every neighbour view
    audited, the sums attacked (``sums``) and (``plain``) the plain eavesdropper run on the same setup."""
    from ..config import SOLVER_DEFAULTS

    name, blocks, graph, g_max, solver, over = _resolve_scenario(sc, seed)
    rank = solver.pop("rank", None) or min(5, blocks[0].shape[0])
    fit_kw = dict(solver, g_max=g_max, **iters, negative="allow", seed=seed)
    fit_kw.update(over)
    fit_kw.update(settings or {})  # given settings over the scenario's (random_caps: paper with unequal caps)
    schedule = fit_kw.get("penalty_schedule", SOLVER_DEFAULTS.penalty_schedule)
    codec = dict(codec)
    if codec["n_max"] is None:
        codec["n_max"] = fitting_n_max(blocks, graph, g_max, g_bits=codec["g_bits"], key_bits=codec["key_bits"],
                                       penalty_schedule=schedule, init=fit_kw.get("init"))
    t0 = time.perf_counter()
    say(f"[{name}] recording the integer protocol ({fit_kw['bcd_iters']} BCD x {fit_kw['x_iters']} "
        f"ADMM iterations, penalty_schedule={schedule}, n_max={codec['n_max']:g})")
    rec = record_fit(blocks, graph, rank, kind="quantized", **codec, **fit_kw)
    entry = {"graph": _graph_info(graph), "g_max": g_max, "penalty_schedule_setting": schedule,
             "n_max": codec["n_max"],
             "iterations": {k: fit_kw[k] for k in ("bcd_iters", "x_iters", "y_iters")},
             "fit": {"nmse": rec.nmse, "consensus": rec.consensus}, "protocols": {}}
    entry["penalty_schedule"] = _penalty_schedule(rec)
    if sums:
        say(f"[{name}] integer and lattice attacks on the sums")
        x_max = public_x_max(g_max, codec["g_bits"], schedule)
        entry["sums"] = sums_audit(rec, x_max=x_max, max_calls=sums_max_calls)
        entry["schedule_leak"] = schedule_audit(rec, x_max=x_max)
    for proto in protocols:
        say(f"[{name}] attacks under protocol={proto}")
        entry["protocols"][proto] = neighbour_audit(rec, proto)
    if "masked" in protocols:
        say(f"[{name}] two colluding neighbours of one agent")
        entry["collusion"] = collusion_audit(rec)
        if masked_real is not None:
            entry["masked_ciphertexts"] = _masked_real(name, blocks, graph, rank, fit_kw, codec, masked_real, say)
    say(f"[{name}] a receiver that differences its sums across calls")
    entry["across_calls"] = difference_attack(rec)["summary"]
    if to_stop:
        entry["across_calls_to_stop"] = _to_stop(name, blocks, graph, rank, fit_kw, codec, to_stop, say)
    if secagg:
        entry["secagg"] = _secagg_real(name, blocks, graph, rank, fit_kw, codec, schedule, sums, sums_max_calls, say)
    if plain:
        say(f"[{name}] plain run for the eavesdropper")
        prec = record_fit(blocks, graph, rank, kind="plain", **fit_kw)
        entry["eavesdropper_plain"] = eavesdropper_plain(prec)
    entry["seconds"] = time.perf_counter() - t0
    return name, entry


def _audit_paillier(scenario: str, *, seed, iters: dict, codec: dict, protocols, say, settings=None) -> dict:
    """Per protocol, the real Paillier run of ``scenario``: its transcript scanned and, under
    ``aggregated``, every reply decrypted on its own with its receiver's key."""
    blocks, graph, g_max, solver, _ = _scenario(scenario, seed)
    rank = solver.pop("rank")
    codec = dict(codec)
    if codec["n_max"] is None:
        codec["n_max"] = fitting_n_max(blocks, graph, g_max, g_bits=codec["g_bits"], key_bits=codec["key_bits"],
                                       penalty_schedule=(settings or {}).get("penalty_schedule"),
                                       init=(settings or {}).get("init"))
    out = {}
    for proto in protocols:
        say(f"[paillier/{proto}] {codec['key_bits']}-bit keys, {iters['bcd_iters']} BCD x {iters['x_iters']} ADMM "
            "iterations, transcript scan")
        t0 = time.perf_counter()
        # the audit makes the keys, so that it can decrypt as each agent can
        keys = _make_keypairs(codec["key_bits"], graph.n_agents)
        with record_seeds() as drawn:
            rec = record_fit(blocks, graph, rank, kind="paillier", protocol=proto, **codec, g_max=g_max, **iters,
                             negative="allow", seed=seed, keypairs=keys, **(settings or {}))
        ev = eavesdropper_paillier(rec, seeds=drawn)
        ev["scenario"] = scenario
        if proto == "aggregated":
            ev["decrypt_each"] = decrypt_each_check(rec, keys)
        if proto == "masked":
            tagged, plan = tag_seeds(rec, drawn)
            ev["masked_ciphertexts"] = masked_ciphertext_audit(rec, keys, tagged, plan)
        del drawn
        del keys
        ev["seconds"] = time.perf_counter() - t0
        out[proto] = ev
    return out


def run_audit(scenarios=SCENARIOS, *, seed=0, bcd_iters=10, x_iters=30,
              y_iters=30, n_max=None, g_bits=16, key_bits=128, protocols=("paper", "aggregated", "masked"),
              paillier=True, paillier_bcd_iters=2, paillier_x_iters=3, paillier_y_iters=30,
              paillier_scenario="paper_synthetic", masked_bcd_iters=2, plain=True, settings=None, sums=True,
              sums_max_calls=20, secagg=True, to_stop=None, progress=None) -> dict:
    """Run the privacy audit and return the report (a JSON-ready dict).

    Parameters
    ----------
    scenarios : sequence of str or of (name, blocks, graph, g_max[, solver kwargs])
        Named ones (:data:`SCENARIOS`): ``paper_synthetic`` (``make_trial(PAPER_EXPERIMENTS
        ["paper_synthetic"], seed)``: N = 10, average degree 3, equal caps 0.033), ``star``
        (the same data on a star: 9 degree-1 leaves), ``random_caps`` (the paper's graph,
        each cap drawn in [0.5, 1.5] x 0.033) and ``short_admm`` (the paper's setup with 3
        ADMM iterations per X-step, so that the penalties are still being drawn when the
        first informative messages go out); ``ring`` (the same data on a ring, every agent of
        degree 2) runs when named.
    seed : int
    bcd_iters, x_iters, y_iters : int
        Iterations of the recorded runs (the paper runs 100 BCD iterations; the leakage
        per iteration does not depend on how many follow).
    n_max, g_bits, key_bits : codec (``key_bits`` is also the Paillier key size). ``n_max=None``:
        per scenario, the largest of 1e6, 5e5, 2e5, ... that the codec's range holds under the
        scenario's penalty schedule (:func:`fitting_n_max`; the library's default schedule can
        grow the caps 32-fold, which ``1e6`` does not fit for every scenario); the report
        gives the value used per scenario.
    protocols : which neighbour views to audit (``"masked"``: also two colluding agents, and,
        with ``paillier``, a real masked run per scenario whose replies are decrypted one by
        one, :func:`~.masked.masked_ciphertext_audit`).
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
    masked_bcd_iters : int
        BCD iterations (of ``x_iters`` ADMM iterations) of the real masked run per scenario
        (``protocols`` with ``"masked"`` and ``paillier``; 0: none).
    plain : bool
        Also run ``exchange="plain"`` per scenario for the plain eavesdropper.
    settings : dict, optional
        Solver keywords of every recorded run (e.g. ``ppdnmf_torch.PAPER_SETTINGS``); None: the
        library's defaults (``penalty_schedule="adaptive"``, ``init="random"``).
    sums : bool
        Run the sums attacks on each scenario (:func:`~.sums.sums_audit`: integer decomposition
        at degree 2, lattice reduction at degree >= 3 when python-flint is installed) and
        :func:`~.sums.schedule_audit` (what the changes of ``rho_int_i`` reveal).
    sums_max_calls : int, optional
        Informative calls attacked per receiver, evenly spread (None: all).
    secagg : bool
        Also run each scenario under ``exchange="secagg"`` (same settings; refused, and reported so,
        under a schedule with per-edge weights) and attack its recording: the curious receiver, the
        sums, colluders, every masked message on the wire, and the adversary across calls
        (``entry["secagg"]``). Every scenario's integer recording gets the adversary across calls
        too (``entry["across_calls"]``, :func:`~ppdnmf_torch.audit.across_calls.difference_attack`).
    to_stop : int, optional
        Also record each scenario until its stopping rule ends it (``fit``'s ``tol`` unless the
        settings give one; at most ``to_stop`` BCD iterations) and run the adversary across calls on
        every call of it (``entry["across_calls_to_stop"]``: the summary, ``bcd_iters_run``,
        ``stopped``). The recorded runs above are too short for the rule to act.
    progress : callable(str), optional
    """
    say = progress or (lambda s: None)
    t_start = time.perf_counter()
    codec = {"n_max": n_max, "g_bits": g_bits, "key_bits": key_bits}
    report = {
        "meta": {
            "audit": "ppdnmf_torch.audit", "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "python": platform.python_version(), "torch": torch.__version__,
            "settings": {"seed": seed, "bcd_iters": bcd_iters, "x_iters": x_iters, "y_iters": y_iters,
                         **codec, "protocols": list(protocols), "solver": dict(settings or {}),
                         "sums_max_calls": sums_max_calls, "secagg": bool(secagg), "to_stop": to_stop},
            "thresholds": {"exact_fraction": EXACT_FRACTION, "beats_baseline_ratio": BEATS_BASELINE_RATIO,
                           "direction_corr": DIRECTION_CORR, "significant": SIGNIFICANT,
                           "correlation_z": CONFIDENCE_Z},
        },
        "scenarios": {},
        "eavesdropper_paillier": {},
        "flags": [],
    }
    iters = {"bcd_iters": bcd_iters, "x_iters": x_iters, "y_iters": y_iters}
    masked_real = masked_bcd_iters if (paillier and "masked" in protocols and masked_bcd_iters > 0) else None
    for sc in scenarios:
        name, entry = _audit_scenario(sc, seed=seed, iters=iters, codec=codec, protocols=protocols, plain=plain,
                                      say=say, masked_real=masked_real, settings=settings, sums=sums,
                                      sums_max_calls=sums_max_calls, secagg=secagg, to_stop=to_stop)
        report["scenarios"][name] = entry
    if paillier:
        p_iters = {"bcd_iters": paillier_bcd_iters, "x_iters": paillier_x_iters, "y_iters": paillier_y_iters}
        report["eavesdropper_paillier"] = _audit_paillier(paillier_scenario, seed=seed, iters=p_iters, codec=codec,
                                                          protocols=protocols, say=say, settings=settings)
    report["flags"] = collect_flags(report)
    report["meta"]["seconds"] = time.perf_counter() - t_start
    return report
