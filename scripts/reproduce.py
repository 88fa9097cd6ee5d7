#!/usr/bin/env python
"""Rerun the tables and figures of the docs, and write what the docs include.

    python scripts/reproduce.py --list                 # every block: where it is, its command, its state
    python scripts/reproduce.py --only NAME [NAME ...]  # rerun these blocks and write them into the docs
    python scripts/reproduce.py --all [--max-minutes M] # rerun every block (hours on a 2-core CPU)
    python scripts/reproduce.py --collect NAME          # re-read a block's last outputs, without rerunning it
    python scripts/reproduce.py --fill                  # rewrite the docs' blocks from their records
    python scripts/reproduce.py --check                 # exit 1 when a page's block is not its record

A *block* is a table (or a figure, or a line) of README.md or a page of docs/: the Markdown between
``<!-- generated: NAME -->`` and ``<!-- /generated -->``. ``docs/generated/blocks.yaml`` maps each
NAME to the commands that produce it (the project's own scripts and CLI, run unchanged) and to how
the numbers are read back from what they wrote (a JSON, CSV or Markdown file, or their output).
Running a block writes ``docs/generated/NAME.json``, its *record*: the commands, the tables as the
docs print them, the SHA-256 of the figures it wrote into docs/figures, and a stamp (date, CPU, cores,
torch's CPU capability, threads, versions of torch, numpy and Python, the git commit, the seconds it
took and the machine's load). Every page's block is then rendered from its record
(:func:`render`); ``tests/test_docs.py`` checks that each block equals that rendering, so a number
typed by hand into a block fails the default test run. A block without a record renders as a note
that names its command and its estimated time.

The data the paper's experiments need are not in the repository: ``--cbcl PATH`` (or
``$PPDNMF_CBCL``) and ``--orl PATH`` (or ``$PPDNMF_ORL``); a block that needs a missing file is
skipped with a message. Outputs of the commands go to ``outputs/reproduce/NAME/`` (git-ignored).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = DOCS / "generated"
FIGURES = DOCS / "figures"
REGISTRY = GENERATED / "blocks.yaml"
OUTPUTS = ROOT / "outputs" / "reproduce"
BLOCK = re.compile(r"<!-- generated: (?P<name>[a-z0-9_]+) -->\n(?P<body>.*?)<!-- /generated -->", re.S)
MISSING = "-"
#: what a column's expression may call besides the row's keys
SAFE = {"min": min, "max": max, "len": len, "sum": sum, "abs": abs, "round": round}


# --------------------------------------------------------------------------------------------
# the registry, the pages, the records
# --------------------------------------------------------------------------------------------


def registry() -> dict:
    """NAME -> entry (``commands``, ``minutes``, ``tables``, ...), in the order of blocks.yaml."""
    import yaml

    with open(REGISTRY, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def pages() -> list[Path]:
    """README.md and every reference page (docs/history/ holds dated snapshots, no blocks)."""
    return [ROOT / "README.md"] + sorted(p for p in DOCS.rglob("*.md") if "history" not in p.relative_to(DOCS).parts)


def record_path(name: str) -> Path:
    return GENERATED / f"{name}.json"


def load_record(name: str) -> dict | None:
    p = record_path(name)
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def blocks_in(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# rendering: a record (or its absence) as the Markdown a page holds
# --------------------------------------------------------------------------------------------


def _rel(page: Path, target: Path) -> str:
    return os.path.relpath(target, page.parent).replace(os.sep, "/")


def _table(t: dict) -> list[str]:
    out = [f"**{t['title']}**", ""] if t.get("title") else []
    out.append("| " + " | ".join(t["header"]) + " |")
    out.append("|" + "---|" * len(t["header"]))
    out += ["| " + " | ".join(row) + " |" for row in t["rows"]]
    return out + [""]


def stamp_line(name: str, rec: dict) -> str:
    s = rec["stamp"]
    cmds = "; ".join(f"`{c}`" for c in rec["commands"])
    dirty = " with uncommitted changes" if s.get("dirty") else ""
    return (f"*`python scripts/reproduce.py --only {name}`, {s['date']}, commit {s['commit']}{dirty}: {s['cpu']}, "
            f"{s['cores']} cores, torch CPU capability {s['capability']}, {s['threads']} "
            f"thread{'s' if s['threads'] != 1 else ''}; torch {s['torch']}, numpy {s['numpy']}, Python {s['python']}; "
            f"{s['seconds']:.0f} s at load average {s['load']}. It ran {cmds}.*")


INDEX = "index"  #: the block that lists every block (docs/RESULTS.md), rendered from the registry


def _where() -> dict:
    """Block name -> the pages that hold it."""
    out: dict = {}
    for page in pages():
        for m in blocks_in(page.read_text(encoding="utf-8")):
            out.setdefault(m.group("name"), []).append(page)
    return out


def render_index(page: Path) -> str:
    """Every block: the pages it is on, its state, and how long its commands take."""
    rows, where = [], _where()
    for name, e in registry().items():
        rec = load_record(name)
        on = ", ".join(f"[{p.name}]({_rel(page, p)})" for p in where.get(name, []))
        state = (f"{rec['stamp']['date']}, commit {rec['stamp']['commit']}, {rec['stamp']['seconds']:.0f} s"
                 if rec else f"**not generated** (about {e['minutes']} min)")
        rows.append([f"`{name}`", on, state])
    return "\n".join(_table({"header": ["block", "on", "generated"], "rows": rows}))


def render(name: str, page: Path, entry: dict | None = None, rec: dict | None = None) -> str:
    """The Markdown of block ``name`` on ``page``: the record's tables, lines and figures and its
    stamp, or, without a record, what would write it."""
    if name == INDEX:
        return render_index(page)
    entry = entry if entry is not None else registry()[name]
    rec = rec if rec is not None else load_record(name)
    if rec is None:
        cmds = "; ".join(f"`{c}`" for c in entry["commands"])
        text = (f"*Not generated yet: `python scripts/reproduce.py --only {name}` runs {cmds} (about "
                f"{entry['minutes']} min on the 2-core development machine) and writes this block.")
        if entry.get("history"):
            file, _, anchor = entry["history"].partition("#")
            text += f" The last numbers measured by hand: [history/{file}]({_rel(page, DOCS / 'history' / file)}"
            text += (f"#{anchor}" if anchor else "") + ")."
        return text + "*\n"
    out: list[str] = []
    for t in rec.get("tables", []):
        out += _table(t)
    for line in rec.get("lines", []):
        out += [line, ""]
    for fig, meta in rec.get("figures", {}).items():
        out += [f"![{meta['caption']}]({_rel(page, FIGURES / fig)})", ""]
    return "\n".join(out + [stamp_line(name, rec), ""])


def fill(only: set | None = None) -> list[Path]:
    """Rewrite every page's blocks (those of ``only``, if given) from their records."""
    reg, changed = registry(), []
    for page in pages():
        text = page.read_text(encoding="utf-8")

        def sub(m):
            name = m.group("name")
            if name != INDEX and (name not in reg or (only and name not in only)):
                return m.group(0)
            return f"<!-- generated: {name} -->\n{render(name, page, reg.get(name))}<!-- /generated -->"

        new = BLOCK.sub(sub, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def check() -> list[str]:
    """What is out of step between the registry, the records, the figures and the pages."""
    reg, problems, used = registry(), [], set()
    for page in pages():
        for m in blocks_in(page.read_text(encoding="utf-8")):
            name = m.group("name")
            used.add(name)
            where = f"{page.relative_to(ROOT)}: block {name!r}"
            if name not in reg and name != INDEX:
                problems.append(f"{where} is not in {REGISTRY.relative_to(ROOT)}")
            elif m.group("body") != render(name, page, reg.get(name)):
                problems.append(f"{where} differs from its record (edited by hand, or not filled: "
                                f"python scripts/reproduce.py --fill)")
    problems += [f"{n}: in the registry, on no page" for n in reg if n not in used]
    claimed = {}
    for f in GENERATED.glob("*.json"):
        if f.stem not in reg:
            problems.append(f"{f.relative_to(ROOT)}: a record of no block")
            continue
        for fig, meta in json.loads(f.read_text(encoding="utf-8")).get("figures", {}).items():
            claimed[fig] = f.stem
            if not (FIGURES / fig).exists() or sha256(FIGURES / fig) != meta["sha256"]:
                problems.append(f"docs/figures/{fig}: not the figure block {f.stem!r} wrote")
    problems += [f"docs/figures/{p.name}: written by no block" for p in sorted(FIGURES.glob("*.png"))
                 if p.name not in claimed]
    return problems


# --------------------------------------------------------------------------------------------
# the stamp
# --------------------------------------------------------------------------------------------


def _git(*args) -> str:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_stamp(threads: int) -> dict:
    """What varies between machines and checkouts: the CPU, torch's vector unit, the versions."""
    import numpy
    import torch

    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # an older torch
        cap = "unknown"
    status = _git("status", "--porcelain", "--", "ppdnmf_torch", "conf", "scripts")
    dirty = [ln for ln in status.splitlines() if not ln.endswith("scripts/reproduce.py")] if status != "unknown" else []
    return {"date": _dt.date.today().isoformat(), "commit": _git("rev-parse", "--short", "HEAD"),
            "dirty": bool(dirty), "cpu": _cpu_model(), "cores": os.cpu_count(), "capability": cap,
            "threads": threads, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


# --------------------------------------------------------------------------------------------
# collecting: what the commands wrote -> the tables of the record
# --------------------------------------------------------------------------------------------


def _dig(doc, path):
    for part in str(path).split(".") if path not in (None, "") else []:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _number(v):
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v
    return v


def md_tables(text: str) -> list[dict]:
    """Every Markdown table of ``text``: ``{"header": [...], "rows": [[...]]}``, cells verbatim."""
    tables, cur = [], None
    for line in text.splitlines() + [""]:
        s = line.strip()
        if s.startswith("|") and s.endswith("|"):
            cells = [c.strip() for c in s[1:-1].split("|")]
            if cur is None:
                cur = {"header": cells, "rows": []}
            elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
                cur["rows"].append(cells)
        elif cur is not None:
            tables.append(cur)
            cur = None
    return tables


def _source_rows(spec: dict, out: Path) -> list:
    """The rows of one table's source: dicts (JSON, JSON lines, CSV, regex) or a Markdown table."""
    srcs = spec["source"] if isinstance(spec["source"], list) else [spec["source"]]
    fmt = spec.get("format")
    rows: list = []
    for i, src in enumerate(srcs):
        path = out / ("stdout.txt" if src == "stdout" else src)
        text = path.read_text(encoding="utf-8")
        kind = fmt or {".json": "json", ".csv": "csv", ".md": "md"}.get(path.suffix, "jsonl")
        if kind == "json":
            got = _dig(json.loads(text), spec.get("rows"))
            got = got if isinstance(got, list) else [got]
        elif kind == "jsonl":
            got = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
            got = [r for r in (_dig(r, spec.get("rows")) for r in got) if r is not None]
        elif kind == "csv":
            import csv

            got = [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(text.splitlines())]
        elif kind == "regex":
            got = [{k: _number(v) for k, v in m.groupdict().items()}
                   for m in re.finditer(spec["pattern"], text, flags=re.M)]
        elif kind == "md":
            found = md_tables(text)
            if "match" in spec:
                found = [t for t in found if spec["match"] in " | ".join(t["header"])]
            return [found[spec.get("index", 0)]]
        else:
            raise ValueError(f"format {kind!r}: use json, jsonl, csv, regex or md")
        for r in got:
            if isinstance(r, dict) and spec.get("labels"):
                r = {**r, "_label": spec["labels"][i]}
            rows.append(r)
    return rows


def _cell(column: list, row: dict) -> str:
    """One cell: ``[header, template]`` formats the row's keys; ``[header, template, expression]``
    formats the value of a Python expression of them (the registry is the project's own file)."""
    try:
        if len(column) > 2:
            return column[1].format(eval(column[2], {"__builtins__": SAFE}, dict(row)))  # noqa: S307
        return column[1].format(**row)
    except (TypeError, ValueError, KeyError, IndexError):  # absent by design (None, a row without it)
        return MISSING


def _keep(row, where: dict | None, has: list | None = None) -> bool:
    """Whether a row has every key of ``has`` and the values ``where`` asks for."""
    try:
        for k in has or []:
            _dig(row, k)
        for k, want in (where or {}).items():
            if _dig(row, k) not in (want if isinstance(want, list) else [want]):
                return False
    except (KeyError, IndexError, TypeError):
        return False
    return True


def collect_table(spec: dict, out: Path) -> dict:
    rows = _source_rows(spec, out)
    if spec.get("format") == "md" or (not spec.get("format") and str(spec["source"]).endswith(".md")):
        t = dict(rows[0])
        if "columns" in spec:  # keep some of the script's own columns, in its formatting
            idx = [t["header"].index(c) for c in spec["columns"]]
            t = {"header": [t["header"][i] for i in idx], "rows": [[r[i] for i in idx] for r in t["rows"]]}
    else:
        rows = [r for r in rows if _keep(r, spec.get("where"), spec.get("has"))]
        t = {"header": [c[0] for c in spec["columns"]],
             "rows": [[_cell(c, r) for c in spec["columns"]] for r in rows]}
    if not t["rows"]:
        raise ValueError(f"table from {spec['source']}: no rows (where={spec.get('where')})")
    if spec.get("title"):
        t["title"] = spec["title"]
    return t


def collect(name: str, entry: dict, out: Path) -> dict:
    """The record's content from the block's output folder (the stamp is added by :func:`run`)."""
    rec = {"name": name, "commands": entry["commands"],
           "tables": [collect_table(spec, out) for spec in entry.get("tables", [])]}
    lines = []
    for spec in entry.get("lines", []):
        rows = [r for r in _source_rows(spec, out) if _keep(r, spec.get("where"), spec.get("has"))]
        lines += [_cell([None, spec["template"]], r) for r in rows]
    if lines:
        rec["lines"] = lines
    figs = {}
    for fig in entry.get("figures", []):
        path = FIGURES / fig["file"]
        if not path.exists():
            raise FileNotFoundError(f"{name}: its commands did not write docs/figures/{fig['file']}")
        figs[fig["file"]] = {"caption": fig["caption"], "sha256": sha256(path)}
    if figs:
        rec["figures"] = figs
    return rec


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------


def _data_env(args) -> dict:
    env = {}
    for key, flag in (("PPDNMF_CBCL", args.cbcl), ("PPDNMF_ORL", args.orl)):
        v = flag or os.environ.get(key)
        if v:
            env[key] = str(Path(v).resolve())
    return env


def run(name: str, entry: dict, args) -> dict | None:
    """Run a block's commands in order, then collect and write its record; None when skipped."""
    env = {**os.environ, **_data_env(args)}
    for key in entry.get("needs", []):
        if not env.get(key) or not Path(env[key]).exists():
            print(f"[{name}] skipped: ${key} is not set or not a file (--{key.split('_')[1].lower()} PATH)")
            return None
    out = OUTPUTS / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    threads = int(entry.get("threads", 1))
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), OUT=str(out))
    load, stamp, t0 = _load(), machine_stamp(threads), time.perf_counter()  # the checkout as the run starts
    with open(out / "stdout.txt", "w", encoding="utf-8") as so, open(out / "stderr.txt", "w", encoding="utf-8") as se:
        for cmd in entry["commands"]:
            print(f"[{name}] {cmd}", flush=True)
            r = subprocess.run(cmd, shell=True, executable="/bin/bash", cwd=ROOT, env=env, stdout=so, stderr=se)
            if r.returncode != 0:
                tail = (out / "stderr.txt").read_text(encoding="utf-8")[-2000:]
                raise RuntimeError(f"{name}: `{cmd}` exited with {r.returncode}:\n{tail}")
    seconds = time.perf_counter() - t0
    stamp.update(seconds=round(seconds, 1), load=load)
    (out / "stamp.json").write_text(json.dumps(stamp), encoding="utf-8")  # for --collect
    print(f"[{name}] {seconds:.0f} s", flush=True)
    return recollect(name, entry)


def recollect(name: str, entry: dict) -> dict:
    """Read a block's outputs into its record, with the stamp of the run that wrote them (again
    after a change of its table spec: ``--collect``)."""
    out = OUTPUTS / name
    if not (out / "stamp.json").exists():
        raise SystemExit(f"{name}: no finished run to collect from in outputs/reproduce/{name}")
    rec = collect(name, entry, out)
    rec["stamp"] = json.loads((out / "stamp.json").read_text(encoding="utf-8"))
    record_path(name).write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"[{name}] wrote {record_path(name).relative_to(ROOT)}", flush=True)
    return rec


def list_blocks() -> None:
    reg = registry()
    where = {n: [str(p.relative_to(ROOT)) for p in ps] for n, ps in _where().items()}
    total = 0.0
    for name, e in reg.items():
        rec = load_record(name)
        state = (f"generated {rec['stamp']['date']} at {rec['stamp']['commit']} in {rec['stamp']['seconds']:.0f} s"
                 if rec else f"NOT GENERATED (about {e['minutes']} min)")
        total += 0 if rec else float(e["minutes"])
        print(f"{name}: {state}; on {', '.join(where.get(name, ['no page']))}")
        for c in e["commands"]:
            print(f"    {c}")
    print(f"not generated: about {total:.0f} min of runs in all")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true")
    g.add_argument("--only", nargs="+", metavar="NAME")
    g.add_argument("--all", action="store_true")
    g.add_argument("--collect", nargs="+", metavar="NAME")
    g.add_argument("--fill", action="store_true")
    g.add_argument("--check", action="store_true")
    ap.add_argument("--max-minutes", type=float, default=None, help="with --all: only blocks estimated below this")
    ap.add_argument("--cbcl", help="the MIT-CBCL faces (.mat or folder); default $PPDNMF_CBCL")
    ap.add_argument("--orl", help="orl_faces.mat; default $PPDNMF_ORL")
    args = ap.parse_args(argv)
    reg = registry()
    if args.list:
        list_blocks()
        return 0
    if args.check:
        problems = check()
        print("\n".join(problems) or "every block equals its record")
        return 1 if problems else 0
    if args.fill:
        for p in fill():
            print(f"filled {p.relative_to(ROOT)}")
        return 0
    names = args.only or args.collect or [n for n, e in reg.items()
                                           if args.max_minutes is None or float(e["minutes"]) <= args.max_minutes]
    unknown = [n for n in names if n not in reg]
    if unknown:
        ap.error(f"unknown blocks {unknown}; --list names them")
    for name in names:  # each block into the docs as soon as it is done: a long --all stays consistent
        rec = recollect(name, reg[name]) if args.collect else run(name, reg[name], args)
        if rec is not None:
            for p in fill({name}):
                print(f"filled {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
