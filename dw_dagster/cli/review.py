"""``dw-dagster review``: what a pull request changes in the dbt project, for a person or a CI job.

Exit codes: 0 the policies pass (or none was given); 1 a ``--fail-on`` policy fails (stderr
says which); 2 a usage error (a missing manifest, an unreadable domains file); 3 the report was
made and the policies pass, but ``--notify slack`` could not post.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import click

from dw_dagster.lineage.review_models import POLICIES, Review


def _slack_message(review: Review, domains: list[str]):
    from dw_dagster.integrations.slack import SlackMessage, mrkdwn_escape
    from dw_dagster.lineage.review_report import review_summary

    lines = review_summary(review)
    head = f"dbt review of {review.head}" + (f" (domains {', '.join(domains)})" if domains else "")
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": "dbt pull-request review"[:150], "emoji": False}},
              {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn_escape(head + "\n" + lines[0])[:3000]}}]
    if len(lines) > 1:
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": "\n".join("• " + mrkdwn_escape(x) for x in lines[1:])[:3000]}})
    people = sorted({a for d in review.domains if d.domain in domains for a in d.approvers})
    if people:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn",
                                                        "text": mrkdwn_escape("owners: " + ", ".join(people))[:3000]}]})
    return SlackMessage(text="\n".join([head, *lines]), blocks=blocks)


def _notify_slack(review: Review, fallback_channel: str | None) -> list[str]:
    """Post the summary to each reached domain's channel (else ``fallback_channel``); return the problems."""
    from dw_dagster.integrations.slack import SlackResource

    token = os.environ.get("SLACK_BOT_TOKEN")
    if not token:
        return ["--notify slack needs SLACK_BOT_TOKEN (a bot token with chat:write)"]
    channels: dict[str, list[str]] = {}
    for d in review.domains:
        if d.slack_channel:
            channels.setdefault(d.slack_channel, []).append(d.domain)
    if not channels and fallback_channel:
        channels[fallback_channel] = []
    if not channels:
        return ["--notify slack: no reached domain names a slack_channel, and no --slack-channel / SLACK_CHANNEL"]
    slack = SlackResource(bot_token=token, base_url=os.environ.get("SLACK_API_URL", "https://slack.com/api"))
    digest = hashlib.sha256(review.model_dump_json().encode()).hexdigest()[:16]
    problems = []
    for channel, names in channels.items():
        try:
            slack.post_message(_slack_message(review, names), channel=channel, ref=f"dw:review-{digest}:{channel}")
            click.echo(f"posted the review to Slack channel {channel}" + (f" ({', '.join(names)})" if names else ""), err=True)
        except Exception as e:  # noqa: BLE001 - one channel's failure is reported; the others still get theirs
            problems.append(f"Slack channel {channel}: {type(e).__name__}: {e}")
    return problems


@click.command("review")
@click.option("--base", required=True, type=click.Path(exists=True),
              help="The base branch's dbt target/ folder or manifest.json (what --state would point at).")
@click.option("--head", required=True, type=click.Path(exists=True), help="The pull request's target/ folder or manifest.json.")
@click.option("--json", "as_json", is_flag=True, help="Print the review as one JSON object (Review) instead of text.")
@click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the pull-request comment (GitHub Markdown) to this file.")
@click.option("--fail-on", "fail_on", multiple=True, type=click.Choice(POLICIES),
              help="Exit 1 on breaking changes, sensitive-looking new columns, or any change (repeatable).")
@click.option("--domains", "domains_file", type=click.Path(dir_okay=False), default=None,
              help="Domains file: owners, Slack channels, sensitive-column rules (default: $DW_DOMAINS_FILE, if set).")
@click.option("--notify", type=click.Choice(["slack"]), default=None,
              help="Post the summary to each reached domain's slack_channel (SLACK_BOT_TOKEN; SLACK_API_URL optional).")
@click.option("--slack-channel", default=lambda: os.environ.get("SLACK_CHANNEL"),
              help="Channel for --notify slack when no reached domain names one (default: $SLACK_CHANNEL).")
def review_cmd(base: str, head: str, as_json: bool, markdown_file: str | None, fail_on: tuple[str, ...],
               domains_file: str | None, notify: str | None, slack_channel: str | None) -> None:
    """What a pull request changes in the dbt project: state:modified with reasons, column changes (breaking or
    not), the blast radius (= dbt ls -s state:modified+ --state BASE), sensitive-looking new columns, owners.

    BASE and HEAD are the dbt target/ folders (or manifest.json files) of `dbt parse` on the base branch and on
    the pull request; a catalog.json beside a manifest adds the warehouse's column types.
    """
    from dw_dagster.core.domains import DomainsFileError
    from dw_dagster.lineage.review import review_manifests
    from dw_dagster.lineage.review_report import review_markdown, review_text

    try:
        review = review_manifests(base, head, domains=domains_file)
    except DomainsFileError as e:
        raise click.BadParameter(str(e), param_hint="--domains") from e
    except (FileNotFoundError, ValueError) as e:
        raise click.UsageError(str(e)) from e
    failures = review.failures(fail_on)
    if markdown_file:
        Path(markdown_file).write_text(review_markdown(review, failures))
    if as_json:
        click.echo(json.dumps(review.model_dump(mode="json"), indent=2))
    else:
        click.echo(review_text(review, failures))
    problems = _notify_slack(review, slack_channel) if notify == "slack" else []
    for p in problems:
        click.echo(f"notify: {p}", err=True)
    for f in failures:
        click.echo(f"review failed --fail-on {f}", err=True)
    if failures:
        sys.exit(1)
    if problems:
        sys.exit(3)


def register(main: click.Group) -> None:
    """Add ``review`` to the ``dw-dagster`` group."""
    main.add_command(review_cmd)
