"""``ppdnmf [overrides] --help``: the task's own help (``conf/hydra/help/<task>.yaml``) with its
composed config, rendered here: the same text as Hydra's ``--help``, without the seconds Hydra
takes to list the options of every group (its own included) before it looks at the template.
Nothing here imports torch.
"""
from __future__ import annotations

import os

from omegaconf import OmegaConf

from .config_dir import CONFIG_DIR

__all__ = ["show_help", "config_groups", "wants_help"]


def config_groups(folder: str = CONFIG_DIR) -> str:
    """``group: option, option`` lines of the config folder (Hydra's own groups left out), as
    Hydra's ``$APP_CONFIG_GROUPS`` lists them."""
    groups = {}
    for root, _, names in os.walk(folder):
        rel = os.path.relpath(root, folder).replace(os.sep, "/")
        if rel == "." or rel.split("/")[0] == "hydra":
            continue
        options = sorted(n[:-5] for n in names if n.endswith(".yaml"))
        if options:
            groups[rel] = options
    return "".join(f"{g}: {', '.join(o)}\n" for g, o in sorted(groups.items()))


def show_help(overrides) -> str:
    """The text of ``ppdnmf [overrides] --help``: the task's own help (``conf/hydra/help/<task>.yaml``)
    with its composed config. The same text as Hydra's ``--help``, without the seconds Hydra takes
    to list the options of every group, Hydra's own included, before it looks at the template."""
    import string

    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    template = cfg.hydra.help.template
    shown = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    return string.Template(template).safe_substitute(APP_CONFIG_GROUPS=config_groups(), HYDRA_CONFIG_GROUPS="",
                                                     FLAGS_HELP="", CONFIG=OmegaConf.to_yaml(shown))


def wants_help(argv) -> bool:
    """``--help`` (or ``-h``) of one run, without Hydra's other flags that change what it means."""
    flags = [a for a in argv if a.startswith("-")]
    return bool(flags) and all(a in ("--help", "-h") for a in flags)
