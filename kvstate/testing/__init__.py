"""kvstate.testing: what the verification stack drives the allocator with, never imported by it.

``adapter`` (the conformance target: one spec action at a time on a real cache),
``datacheck`` (byte-exact verification of what a running request reads) and ``seeded`` (the
seeded bugs: source edits of a staged, in-process copy of ``impl/``) sit on top of
``kvstate.impl``; the production path (``kvstate.impl``, ``kvstate.spec``, ``kvstate.kernels``)
never imports this package (``tests/test_import_layers.py`` checks), so a verification helper
cannot end up on the request path or in the compiled build.
"""
