"""Studies: the functions behind the reproduction scripts' tables and figures, out of the library.

They run the library's public functions and return plain numbers; the scripts beside this folder
(``scripts/reproduce_*.py``) put ``scripts/`` on ``sys.path`` and import them as ``studies.<name>``.
"""
