"""``DataOpsComponent`` and its scaffolder."""
