"""Fitting a law and its uncertainty: a form over architectures (``forms.Law``), the batched solver
and multi-start search (``optimize``), a fitted law (``fit.LawFit``), Epoch AI's Huber likelihood
(``mle``), and the bootstrap's noise, draws and case resampling (``bootstrap``, ``resample``)."""
