"""Writers of the run bundle's files: the bundle itself (``bundle``), the Perfetto and
Chrome traces (``traces``) and the flame graph drawings (``flamegraph``).

Exporters format what they are handed; they compute no figure of their own. They sit on
the core and below the runtime and the backends, which write bundles through them.
"""
