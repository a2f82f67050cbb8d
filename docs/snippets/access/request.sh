dw-dagster access request --database warehouse --who dana.ortiz@grocer.example --grant analyst --for 8h --why "quarter close" --dry-run --json
dw-dagster access request --database warehouse --who dana.ortiz@grocer.example --tables crm.customers --columns customer_id,region --for 2h --why "refund check" --login --json
dw-dagster access confirm acc-1a2b3c4d5e --login     # a draft (asked without proof of who you are) is filed
dw-dagster approve ar-1a2b3c4d5e-crm --login         # each affected domain's owner, through the usual approval
dw-dagster access list --active --json
