"""Site mode's model-free parts: a party that holds only its own data joins a run over ranks.

A *site* is one rank of a run whose process was given its own data only (docs/DEPLOYMENT.md).
What every site must agree on beforehand is the run's *public description* (the graph, the
owner of every agent, the shapes, the model's settings, the seed of the agreed penalties); at
rendezvous the sites compare their descriptions field by field (:func:`agree_description`),
so that a site started with other settings is refused with one line that says what differs
(the description is public: it is what crosses, never the data or a hash of it).
"""
from __future__ import annotations

from ..errors import ConfigError, DataError
from .comm import Comm

__all__ = ["agree_description", "site_owner", "split_own_columns", "own_agents"]


def _show(v) -> str:
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= 60 else text[:57] + "..."


def agree_description(comm: Comm, description: dict, *, key: str = "site") -> None:
    """Every site runs the run this one does, or every site stops with the same kind of line.

    Parameters
    ----------
    comm : Comm
    description : dict
        The public description as this site holds it (plain Python values: numbers, strings,
        lists); sent to every other site (category ``setup``).
    key : str
        The parameter a refusal names (:class:`~ppdnmf_torch.errors.ConfigError`'s ``key``).

    Raises
    ------
    ConfigError
        ``site 2 has rank=6, this site rank=5`` for the first site (in rank order) and the
        first field (in this site's order) that differ.
    """
    everyone = comm.all_gather_object(description, category="setup",
                                      what="the check that every site runs the same public description")
    for r, other in enumerate(everyone):
        if r == comm.rank or other == description:
            continue
        for name in list(description) + [n for n in other if n not in description]:
            mine, theirs = description.get(name, "<unset>"), other.get(name, "<unset>")
            if mine != theirs:
                raise ConfigError(f"site {r} has {name}={_show(theirs)}, this site (site {comm.rank}) "
                                  f"{name}={_show(mine)}: every site must start with the same public description",
                                  key=key)


def site_owner(assignment, n_agents: int, world_size: int) -> list:
    """The site (rank) of every agent: ``assignment`` as given, or agent ``i`` on site ``i`` when
    there are as many agents as sites."""
    if assignment is None:
        if n_agents != world_size:
            raise ConfigError(f"the graph has {n_agents} agents and the run {world_size} sites: give the site of "
                              "every agent (assignment), or one agent per site", key="assignment")
        return list(range(n_agents))
    owner = [int(a) for a in assignment]
    if len(owner) != n_agents:
        raise ConfigError(f"gives {len(owner)} sites for the graph's {n_agents} agents", key="assignment")
    bad = [a for a in owner if not 0 <= a < world_size]
    if bad:
        raise ConfigError(f"names site {bad[0]}, the run has sites 0..{world_size - 1}", key="assignment")
    empty = sorted(set(range(world_size)) - set(owner))
    if empty:
        raise ConfigError(f"site {empty[0]} holds no agent; every site holds at least one", key="assignment")
    return owner


def own_agents(owner, site: int) -> list:
    """The global ids of ``site``'s agents, increasing."""
    return [i for i, r in enumerate(owner) if r == site]


def split_own_columns(Z, agents, columns, rows: int | None = None, *, key: str = "data") -> dict:
    """A site's matrix ``Z (L, sum of its agents' M_i)`` cut into its agents' blocks.

    Parameters
    ----------
    Z : Tensor (L, M_site)
        The site's columns, its agents' blocks side by side in increasing agent id.
    agents : list of int
        The site's agents (:func:`own_agents`).
    columns : sequence of int, length N
        Every agent's ``M_i`` (public).
    rows : int, optional
        ``L`` when the description fixes it.

    Returns
    -------
    dict
        ``{agent: block (L, M_i)}``.

    Raises
    ------
    DataError
        One line naming ``key`` when the shape is not the one the description gives.
    """
    if Z.dim() != 2:
        raise DataError(f"expected a 2-D matrix (L, M), got shape {tuple(Z.shape)}", key=key)
    want = sum(int(columns[i]) for i in agents)
    if Z.shape[1] != want or (rows is not None and Z.shape[0] != rows):
        shape = f"({rows if rows is not None else 'L'}, {want})"
        raise DataError(f"has shape {tuple(Z.shape)}, this site's agents {agents} hold {shape} by the public "
                        f"description (columns {[int(columns[i]) for i in agents]})", key=key)
    out, start = {}, 0
    for i in agents:
        out[i] = Z[:, start:start + int(columns[i])]
        start += int(columns[i])
    return out
