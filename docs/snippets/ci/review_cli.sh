dw-dagster review --base base-target --head head-target [--json] [--markdown review.md] \
    [--fail-on breaking] [--fail-on sensitive] [--fail-on any] [--domains domains.yaml] [--notify slack]
