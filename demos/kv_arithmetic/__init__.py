"""Key-value arithmetic (CALM paper, section 4.1) on a CPU: python -m demos.kv_arithmetic."""
