//! Queue administration: stats, DLQ peek and redrive, purge (used by the `conveyor` CLI).
