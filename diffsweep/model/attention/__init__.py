"""Attention kinds' modules (what is computed: ``standard``, ``diff_v1``, ``diff_v2``, all
``base.AttentionModule``) and backends (which kernel computes it: ``backends``).

Nothing is imported here. Which module a kind uses is its ``KindSpec.module``
(``diffsweep.config.kinds``); λ_init's schedule is ``diffsweep.config.lambda_init``.
"""
