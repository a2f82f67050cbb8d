# the repair ran and verified; put its window back (its own change set, approved like any)
dw-dagster undo cs-d19b3c7457
dw-dagster approve cs-d19b3c7457-undo --login
# after the undo's verified receipt the incident is open again ("undone, open again")
dw-dagster incidents
# propose the original change set again, as a new version (or: dw-dagster undo cs-d19b3c7457-undo)
dw-dagster change-sets repropose cs-d19b3c7457
# the whole loop, undo included, on the example
dw-dagster demo store-sales --undo --json
