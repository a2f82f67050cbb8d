dw-dagster demo store-sales --partitions hourly --json   # the same incident by the hour: 30 partitions repaired
dw-dagster demo store-sales --partitions weekly --json   # by the week (weeks from Saturday)
