"""Core records, keys, the ledger and the event-log reader that every stage of the loop stands on."""
