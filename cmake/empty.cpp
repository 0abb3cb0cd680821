// Compiled into modules that have no sources yet, so every module target exists.
