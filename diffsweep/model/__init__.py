"""Model zoo: the LLaMA-style decoder with Transformer, DIFF V1 and DIFF V2 attention.

Import what you need from submodules: ``diffsweep.model.counting`` is pure Python;
``diffsweep.model.transformer`` imports torch.
"""
