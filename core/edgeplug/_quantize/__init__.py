"""Quantization, in one package (importing it loads nothing):

- ``quantize``: ``edgeplug.quantize``, a program quantized by the backend's own PT2E quantizer (or a
  torchao source transform), its norms recomposed first;
- ``program``: what a quantized program is apart from how it was made (``QuantizedModel``, which
  ``quantize`` returns and ``lower`` takes; ``is_quantized``; each output's scale; the report's account).

``program`` sits below the pipeline and verification; ``quantize`` below the pipeline only.
"""
