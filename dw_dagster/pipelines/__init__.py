"""The pipeline shapes dw_dagster diagnoses and repairs: incremental loads and dead-letter sinks."""
