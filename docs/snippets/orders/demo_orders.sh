dw-dagster demo orders [--scale 0.1] [--workdir .dw_demo] [--json]
