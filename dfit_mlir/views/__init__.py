"""Views of a bundle for people: ``dfit view`` (one self-contained HTML file,
:mod:`dfit_mlir.views.html`) and the Model Explorer adapter (``explorer_adapter``)."""
