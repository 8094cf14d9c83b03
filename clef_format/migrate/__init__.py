"""The migration engine: ``plan`` (pure) -> ``apply`` (the only writer, via ``writer`` and ``fsutil``) -> verify."""
