"""Recording a PPDNMF run: :func:`record_fit`, :func:`~ppdnmf_torch.models.ppdnmf.api.fit` through
a recording exchange (:func:`ppdnmf_torch.audit.make_recording_exchange`)."""
from __future__ import annotations

from ....audit.recording import Recording, as_recording, make_recording_exchange

__all__ = ["record_fit"]


def record_fit(blocks, graph, rank, *, kind="quantized", protocol="aggregated", n_max=1e6, g_bits=16,
               key_bits=128, keypairs=None, paillier_options=None, transcript=True, **fit_kwargs) -> Recording:
    """Run :func:`ppdnmf_torch.fit` through a recording exchange and return the :class:`Recording`.

    Parameters
    ----------
    blocks : list of N (L, M_i) blocks
    graph : Graph
    rank : int
    kind : {"plain", "quantized", "paillier", "secagg"}
    protocol : {"masked", "aggregated", "paper"}
        Message pattern (``paillier``: what goes on the wire; the integers are the same; ``secagg``
        takes none).
    n_max, g_bits, key_bits
        The codec (``key_bits`` also sets the keys of ``paillier``; default 128 as in the paper).
    keypairs : optional
        Pre-made Paillier key pairs (tests).
    paillier_options : dict, optional
        Further options of the Paillier exchange (``workers``, ``packing``, ...).
    transcript : bool
        ``secagg``: keep its transcript (default; False for long runs whose sums only are attacked).
    **fit_kwargs
        Any other keyword of :func:`~ppdnmf_torch.fit` (``bcd_iters``, ``g_max``, ...).
    """
    from ..api import fit
    from ....graph import Graph

    if not isinstance(graph, Graph):
        from ..problem import as_graph

        graph = as_graph(graph)
    exch = make_recording_exchange(kind, protocol=protocol, n_max=n_max, g_bits=g_bits, key_bits=key_bits,
                                   keypairs=keypairs, paillier_options=paillier_options, transcript=transcript)
    fit_kwargs.setdefault("device", "cpu")
    import warnings

    from ....errors import DegreeOneWarning, SumLeakWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegreeOneWarning)  # the audit flags these agents itself
        warnings.simplefilter("ignore", SumLeakWarning)  # and measures what the sums give away
        result = fit(blocks, graph, rank, exchange=exch, **fit_kwargs)
    # secagg has no protocol to choose: its recording says so
    return as_recording(exch, graph, kind, "secagg" if kind == "secagg" else protocol, n_max, g_bits, result)
