"""A symmetric-NMF site's file and its checks before connecting (issue 39): ``columns_from_links``
makes a party's columns from the links it knows; the app's site run checks the public node sets,
the file's shape and the adaptive penalty's plain sums, each with one line naming the key."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.models.symnmf.site import columns_from_links, cut_columns


def _graph(n=9, seed=2):
    rng = np.random.default_rng(seed)
    W = np.triu(rng.random((n, n)) * (rng.random((n, n)) < 0.5), 0)
    return W + np.triu(W, 1).T  # symmetric, some self-links


@pytest.mark.parametrize("nodes", [[0, 1, 2], [7, 3, 5, 0], list(range(9))])
def test_columns_from_links_are_the_columns_of_the_whole_similarity(nodes):
    """Only the links touching the party's nodes, each given once (either direction): its columns."""
    X = _graph()
    i, j = np.nonzero(np.triu(X))
    links = np.stack([i, j, X[i, j]], axis=1)
    mine = links[np.isin(links[:, :2], nodes).any(axis=1)]
    mine[::2, :2] = mine[::2, 1::-1]  # the direction a party writes a link in does not matter
    got = columns_from_links(mine, nodes, 9)
    assert torch.equal(got, torch.from_numpy(X[:, nodes]))
    assert torch.equal(cut_columns(X, [nodes], [0]), torch.from_numpy(X[:, nodes]))


def test_repeated_links_add_up_and_unweighted_links_weigh_one():
    got = columns_from_links([[0, 2], [2, 0], [1, 1]], [0, 1], 3)
    assert got.tolist() == [[0.0, 0.0], [0.0, 1.0], [2.0, 0.0]]


@pytest.mark.parametrize("links, nodes, text", [
    ([[1, 2]], [0], "links: row 0 links nodes [1, 2], neither of them this party's"),
    ([[0, 3]], [0], "links: node ids must be integers in 0..2"),
    ([[0, 1.5]], [0], "links: node ids must be integers in 0..2"),
    ([[0, 1, 2, 3]], [0], "links: expected rows (i, j) or (i, j, w), got shape (1, 4)"),
    ([[0, 1]], [0, 0], "nodes: give distinct node ids in 0..2, got [0, 0]"),
])
def test_bad_links_are_one_line_naming_them(links, nodes, text):
    with pytest.raises(DataError) as info:
        columns_from_links(links, nodes, 3)
    assert str(info.value) == text


def _cfg(penalty=0.5, aggregation=None, kind="secagg", n_agents=2):
    agents = SimpleNamespace(n_agents=n_agents, penalty=penalty, aggregation=aggregation)
    return SimpleNamespace(agents=agents, exchange=SimpleNamespace(kind=kind))


def _opts(columns=(2, 3), parts=None, assignment=None):
    return SimpleNamespace(columns=list(columns), parts=parts, assignment=assignment, data="own.npy")


def test_a_site_holds_its_agents_columns_by_the_public_parts():
    from ppdnmf_torch.app.site_symnmf import own_similarity_columns, public_parts

    assert public_parts(_opts(), 2) == [[0, 1], [2, 3, 4]]
    parts = [[4, 0], [1, 2, 3]]
    own = own_similarity_columns(_cfg(), _opts(parts=parts), 1, 2, torch.zeros(5, 3))
    assert own["agents"] == [1] and own["n"] == 5 and own["parts"] == parts
    both = own_similarity_columns(_cfg(), _opts(assignment=[0, 0]), 0, 1, torch.zeros(5, 5))
    assert both["agents"] == [0, 1]


@pytest.mark.parametrize("cfg, opts, key, text", [
    (_cfg(), _opts(columns=(5,)), "site.columns", "1 counts, the run has agents.n_agents=2"),
    (_cfg(), _opts(parts=[[0, 1], [2, 3, 3]]), "site.parts", "must cover the nodes 0..4 (n = sum of site.columns) "
                                                             "exactly once"),
    (_cfg(), _opts(parts=[[0, 1, 2], [3, 4]]), "site.parts", "the agents hold [3, 2] nodes, site.columns says [2, 3]"),
    (_cfg(), _opts(parts=[[0, 1]]), "site.parts", "give every agent's node ids, 2 lists of integers"),
    (_cfg(), _opts(), "site.data (own.npy)", "has shape (5, 2), this site's agents [1] hold (5, 3) by the public "
                                             "description (n = 5 nodes, columns [3])"),
    (_cfg(), _opts(assignment=[0, 2]), "site.assignment", "names site 2, the run has sites 0..1"),
    (_cfg(penalty="adaptive", kind="quantized"), _opts(), "agents.aggregation",
     "'quantized' (null takes the exchange's kind, 'quantized') has no protocol across sites"),
    (_cfg(penalty="adaptive", aggregation="quantized", kind="plain"), _opts(), "agents.aggregation",
     "'quantized' has no protocol across sites"),
])
def test_what_does_not_match_the_public_description_is_one_line_before_connecting(cfg, opts, key, text):
    from ppdnmf_torch.app.site_symnmf import own_similarity_columns

    with pytest.raises((ConfigError, DataError)) as info:
        own_similarity_columns(cfg, opts, 1, 2, torch.zeros(5, 2))
    assert info.value.key == key and str(info.value).startswith(f"{key}: {text}"), str(info.value)


@pytest.mark.parametrize("penalty, aggregation, kind", [("adaptive", "plain", "secagg"), ("adaptive", None, "plain"),
                                                        (0.5, None, "secagg"), ("adaptive", None, "secagg")])
def test_the_plain_sums_pass_where_they_are_named_or_not_needed(penalty, aggregation, kind):
    from ppdnmf_torch.app.site_symnmf import own_similarity_columns

    cfg = _cfg(penalty=penalty, aggregation=aggregation, kind=kind)
    assert own_similarity_columns(cfg, _opts(), 0, 2, torch.zeros(5, 2))["agents"] == [0]
