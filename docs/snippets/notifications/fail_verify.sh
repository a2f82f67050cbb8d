dw-dagster demo store-sales --fail-verify --json   # the repair does not verify: the page stays open, the ladder climbs
dw-dagster approvals serve                         # the review site: /incidents/<id>, /change-sets/<id>
