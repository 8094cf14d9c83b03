"""What a Clef checkpoint is: layouts, the tables format, the marker, the joint head, the model spec,
quantization schemes, finding codes and the plugin/layout compatibility rules.

Standard library only (``packaging`` is imported lazily where a PEP 440 specifier must be parsed):
everything else in clef_format builds on these definitions, and none of them reads a file.
"""
