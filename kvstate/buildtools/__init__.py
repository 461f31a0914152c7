"""Build tooling of the allocator, kept out of ``impl/``: nothing the allocator runs imports it.

``aotgen`` writes ``impl/_aot.py`` (the compiled twins of the generated guards); ``mypyc_docs``
puts the docstrings into the C that mypyc generates (``setup.py`` runs it by path).  Outside
``impl/`` the coverage and generated-mutant figures of ``impl/`` are about the allocator alone.
"""
