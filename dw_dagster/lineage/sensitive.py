"""Rules that make a new column look like personal data, and the matching of a column against them.

A rule (:class:`~dw_dagster.core.domains.SensitiveRule`) is a case-insensitive regular expression
matched against a column's name (normalised to lower snake case: ``CustomerEMail`` →
``customer_e_mail``, ``"Home Address"`` → ``home_address``), its description, its tags or its
``meta`` entries. The built-in rules (:data:`DEFAULT_RULES`) and where each comes from:

- NIST SP 800-122, *Guide to Protecting the Confidentiality of Personally Identifiable
  Information* (2010), section 2.1, lists as PII: names; personal identification numbers (social
  security, passport, driver's licence, taxpayer identification, financial account and credit
  card numbers); address information (street address, email address); asset information (IP or
  MAC address, other persistent host identifiers); telephone numbers; and information linked to
  them such as date and place of birth.
- HIPAA Privacy Rule, 45 CFR 164.514(b)(2)(i) (Safe Harbor de-identification), lists 18
  identifiers, among them names, geographic subdivisions smaller than a state (street address,
  city, ZIP code), all elements of dates directly related to a person (birth date), telephone and
  fax numbers, email addresses, social security numbers, account numbers, certificate/licence
  numbers, device identifiers, URLs and IP addresses.
- GDPR (Regulation (EU) 2016/679), Article 4(1): "online identifiers" identify a person; Recital
  30 names IP addresses and cookie identifiers. Article 9(1): the special categories (racial or
  ethnic origin, political opinions, religious beliefs, trade union membership, genetic,
  biometric and health data, sex life or sexual orientation).
- PCI DSS v4.0, "Account Data": the primary account number (PAN), cardholder name, expiration
  date and service code; sensitive authentication data (card verification codes, PINs).
- Free-text fields (notes, comments, remarks) are dw_dagster's own rule: none of the lists above
  names them, but they are where the identifiers above end up when people type them.
- Annotations: a tag or ``meta`` entry that says ``pii``, ``phi``, ``pci``, ``gdpr``,
  ``personal``, ``sensitive``, ``confidential`` or ``restricted`` is taken at its word.

The domains file can turn the built-in rules off, disable some by name and add its own
(``review.sensitive`` in :mod:`dw_dagster.core.domains`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dw_dagster.core.domains import Domains, SensitiveRule, SensitiveSettings

_NIST = "NIST SP 800-122 §2.1"
_HIPAA = "HIPAA 45 CFR 164.514(b)(2)(i)"
_GDPR = "GDPR Art. 4(1)"

DEFAULT_RULES: tuple[SensitiveRule, ...] = (
    SensitiveRule(name="email", category="email", applies_to=["name"],
                  pattern=r"(^|_)(e_?mail|email_?addr(ess)?|e_?mail_?address)(_|$)",
                  source=f"{_NIST} (email address); {_HIPAA}(F)"),
    SensitiveRule(name="phone", category="phone", applies_to=["name"],
                  pattern=r"(^|_)(phone|phone_?(no|num|number)|mobile|mobile_?(no|number)|msisdn|telephone|tel|fax|cell_?phone)(_|$)",
                  source=f"{_NIST} (telephone numbers); {_HIPAA}(D),(E)"),
    SensitiveRule(name="national_id", category="national_id", applies_to=["name"],
                  pattern=r"(^|_)(ssn|social_?security(_?(no|number))?|national_?id(_?(no|number))?|nin|nino|"
                          r"passport(_?(no|num|number))?|tax_?id|tin|sin|itin|driver_?s?_?licen[cs]e(_?(no|number))?|"
                          r"licen[cs]e_?(no|number)|id_?card(_?(no|number))?|personnummer|aadhaar|cpf|nif|bsn)(_|$)",
                  source=f"{_NIST} (social security, passport, driver's licence, taxpayer identification numbers); "
                         f"{_HIPAA}(G),(K)"),
    SensitiveRule(name="birth_date", category="birth_date", applies_to=["name"],
                  pattern=r"(^|_)(dob|birth_?(date|day|dt)|date_?of_?birth|birthday|birth_?place|place_?of_?birth)(_|$)",
                  source=f"{_NIST} (date and place of birth); {_HIPAA}(C)"),
    SensitiveRule(name="address", category="address", applies_to=["name"],
                  pattern=r"(^|_)(?<!ip_)(?<!mac_)(?<!email_)(?<!mail_)(?<!e_mail_)(?<!web_)"
                          r"(address|addr|street|street_?address|address_?line_?\d*|postcode|post_?code|postal_?code|"
                          r"zip|zip_?code|zipcode|house_?(no|number))(_|$)",
                  source=f"{_NIST} (street address); {_HIPAA}(B)"),
    SensitiveRule(name="person_name", category="name", applies_to=["name"],
                  pattern=r"(^|_)(first_?name|last_?name|full_?name|surname|given_?name|family_?name|maiden_?name|"
                          r"middle_?name|(customer|contact|patient|employee|person|member|holder|cardholder|recipient)_?name)(_|$)",
                  source=f"{_NIST} (name); {_HIPAA}(A); PCI DSS v4.0 (cardholder name)"),
    SensitiveRule(name="card_number", category="card_or_account", applies_to=["name"],
                  pattern=r"(^|_)(card_?(no|num|number)|cc_?(no|num|number)|credit_?card(_?(no|number))?|pan|cvv2?|cvc2?|"
                          r"card_?verification(_?code)?|card_?expiry|expiry_?date|iban|account_?(no|num|number)|"
                          r"acct_?(no|num|number)|routing_?number|sort_?code|pin)(_|$)",
                  source=f"PCI DSS v4.0 (PAN, card verification code, PIN); {_NIST} (financial account and credit card "
                         f"numbers); {_HIPAA}(J)"),
    SensitiveRule(name="network_id", category="ip_or_device", applies_to=["name"],
                  pattern=r"(^|_)(ip|ip_?addr(ess)?|ipv4|ipv6|client_?ip|remote_?addr|mac_?addr(ess)?|device_?id|idfa|gaid|"
                          r"advertising_?id|cookie_?id|imei)(_|$)",
                  source=f"{_GDPR} and Recital 30 (online identifiers, IP addresses, cookie identifiers); {_NIST} (IP or "
                         f"MAC address); {_HIPAA}(M),(O)"),
    SensitiveRule(name="special_category", category="special_category", applies_to=["name"],
                  pattern=r"(^|_)(race|ethnicity|ethnic_?origin|religion|religious_?belief|political_?(opinion|party)|"
                          r"trade_?union|sexual_?orientation|health|diagnosis|medical_?(record|condition)s?|genetic|"
                          r"biometric|fingerprint|disability)(_|$)",
                  source="GDPR Art. 9(1) (special categories of personal data)"),
    SensitiveRule(name="free_text", category="free_text", applies_to=["name"],
                  pattern=r"(^|_)(notes?|comments?|free_?text|remarks?|memo|feedback|message_?body)(_|$)",
                  source="dw_dagster: free text carries whatever identifiers people type into it"),
    SensitiveRule(name="described_as_personal_data", category="described", applies_to=["description"],
                  pattern=r"\b(e-?mail|phone number|telephone|mobile number|date of birth|birth ?date|social security|"
                          r"passport|driver'?s licen[cs]e|national id|tax id|credit card|card number|iban|ip address|"
                          r"home address|street address|postal address|personal data|personally identifiable|pii)\b",
                  source=f"{_NIST}; {_HIPAA}; {_GDPR} (the same identifiers, named in the column's description)"),
    SensitiveRule(name="annotated_sensitive", category="annotated", applies_to=["tags", "meta"],
                  pattern=r"(^|[_=.:])(pii|phi|pci|gdpr|personal(_data)?|sensitive|confidential|restricted)($|[_=.:])",
                  source="the column's own tags or meta say so"),
)
"""The built-in rules, with their sources (module docstring)."""


@dataclass(frozen=True)
class SensitiveMatch:
    """One rule matching one column: the rule, where it matched (``name``, ``description``, ``tags``, ``meta``) and what."""

    rule: SensitiveRule
    matched_on: str
    matched_text: str


def normalise_name(name: str) -> str:
    """Lower snake case: camelCase boundaries and runs of other characters become ``_`` (``"Home Address"`` → ``home_address``)."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name))
    s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
    return re.sub(r"[\W_]+", "_", s.casefold()).strip("_")


def rules_from(settings: SensitiveSettings | Domains | None) -> list[SensitiveRule]:
    """The rules in force: built-in ones (unless ``defaults: false``) minus ``disable``, then the configured ones.

    Raises:
        ValueError: ``disable`` names a rule that is not built in (a typo would silently keep it).
    """
    if isinstance(settings, Domains):
        settings = settings.review.sensitive
    settings = settings or SensitiveSettings()
    unknown = sorted(set(settings.disable) - {r.name for r in DEFAULT_RULES})
    if unknown:
        raise ValueError(f"review.sensitive.disable names no built-in rule: {unknown}; "
                         f"built-in: {[r.name for r in DEFAULT_RULES]}")
    rules = [r for r in DEFAULT_RULES if r.name not in settings.disable] if settings.defaults else []
    return rules + list(settings.rules)


def _falsy(v: Any) -> bool:
    return v is None or v is False or (isinstance(v, (int, float)) and v == 0) or (
        isinstance(v, str) and v.strip().casefold() in ("", "false", "no", "0", "none", "off"))


def _meta_texts(meta: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for k, v in (meta or {}).items():
        key = normalise_name(f"{prefix}{k}")
        if isinstance(v, Mapping):
            yield from _meta_texts(v, f"{prefix}{k}.")
            continue
        if _falsy(v):
            continue
        yield key
        if isinstance(v, (list, tuple)):
            for x in v:
                yield f"{key}={normalise_name(str(x))}"
        elif v is not True:
            yield f"{key}={normalise_name(str(v))}"


def match_column(name: str, rules: Iterable[SensitiveRule], *, description: str = "", tags: Iterable[str] = (),
                 meta: Mapping[str, Any] | None = None) -> list[SensitiveMatch]:
    """Every rule that matches a column, with what it matched (first match per rule).

    Args:
        name: the column name as written.
        rules: the rules in force (:func:`rules_from`).
        description: the column's description.
        tags: its tags; meta: its ``meta`` (nested keys joined with ``.``).
    """
    texts = {
        "name": [normalise_name(name)],
        "description": [description or ""],
        "tags": [normalise_name(t) for t in tags or ()],
        "meta": list(_meta_texts(meta or {})),
    }
    out = []
    for rule in rules:
        rx = re.compile(rule.pattern, re.IGNORECASE)
        for where in rule.applies_to:
            hit = next((t for t in texts[where] if t and rx.search(t)), None)
            if hit is not None:
                out.append(SensitiveMatch(rule, where, hit if where != "description" else rx.search(hit).group(0)))  # type: ignore[union-attr]
                break
    return out


# -- masking evidence that leaves the warehouse ------------------------------------------------------

#: the column that lists which columns of a masked row or record were masked
MASKED_COLUMNS_KEY = "masked_columns"


def masked_text(rule: SensitiveRule) -> str:
    """What a masked value reads as: ``[masked: email]`` (the rule's category; never a hash of the value,
    which a short or guessable value would give away)."""
    return f"[masked: {rule.category}]"


def sensitive_column(name: str, rules: Iterable[SensitiveRule]) -> SensitiveRule | None:
    """The first rule that flags a column by its name, or None (only ``name`` rules apply to evidence:
    a sample carries no description, tags or meta)."""
    return next((m.rule for m in match_column(name, [r for r in rules if "name" in r.applies_to])), None)


def mask_row(row: Mapping[str, Any], rules: Iterable[SensitiveRule]) -> tuple[dict[str, Any], list[str]]:
    """A row (column → value) with the values of sensitive columns masked, and the columns masked."""
    rules = list(rules)
    out, masked = {}, []
    for k, v in row.items():
        rule = sensitive_column(str(k), rules) if v is not None else None
        out[k] = masked_text(rule) if rule is not None else v
        if rule is not None:
            masked.append(str(k))
    return out, masked


def mask_rows(rows: Iterable[Mapping[str, Any]], rules: Iterable[SensitiveRule]) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`mask_row` over a sample: the rows, and every column masked in any of them (in column order)."""
    rules = list(rules)
    out, masked = [], []
    for row in rows:
        r, m = mask_row(row, rules)
        out.append(r)
        masked += [c for c in m if c not in masked]
    return out, masked


def mask_values(values: Any, rules: Iterable[SensitiveRule]) -> Any:
    """Evidence as JSON (dicts, lists, scalars) with every value under a sensitive key masked, at any
    depth; a dict that had values masked names them in ``masked_columns``."""
    rules = list(rules)

    def walk(v: Any) -> Any:
        if isinstance(v, Mapping):
            row, masked = mask_row({k: walk(x) if sensitive_column(str(k), rules) is None else x for k, x in v.items()},
                                   rules)
            if masked:
                row[MASKED_COLUMNS_KEY] = sorted(set(masked) | set(v.get(MASKED_COLUMNS_KEY) or []))
            return row
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(values)


def mask_keyed(keys: list[list[Any]], key_columns: list[str], rules: Iterable[SensitiveRule]) -> tuple[list[list[Any]], list[str]]:
    """Key tuples (values in ``key_columns`` order) with the sensitive key columns' values masked."""
    rules = list(rules)
    flagged = {i: r for i, c in enumerate(key_columns) if (r := sensitive_column(c, rules)) is not None}
    if not flagged:
        return keys, []
    return ([[masked_text(flagged[i]) if i in flagged and v is not None else v for i, v in enumerate(k)] for k in keys],
            [key_columns[i] for i in sorted(flagged)])


def _mask_json_text(text: str, rules: list[SensitiveRule]) -> str:
    """A JSON object held as text (a dead-letter payload) with its sensitive fields masked; other text as it is."""
    import json

    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return text
    if not isinstance(data, (dict, list)):
        return text
    return json.dumps(mask_values(data, rules), default=str)


def mask_evidence_values(values: Any, key_columns: list[str], rules: Iterable[SensitiveRule]) -> Any:
    """Evidence values with every sensitive value masked: fields by their name (:func:`mask_values`), key
    lists (``[v1, v2]`` under ``key``, or rows that are key lists) by ``key_columns``, and JSON payload text."""
    rules = list(rules)
    flagged = {i for i, c in enumerate(key_columns) if sensitive_column(c, rules) is not None}

    def key_list(v: list) -> list:
        return [masked_text(sensitive_column(key_columns[i], rules)) if i in flagged and x is not None else x  # type: ignore[arg-type]
                for i, x in enumerate(v)]

    def walk(v: Any) -> Any:
        if isinstance(v, Mapping):
            out = {}
            for k, x in v.items():
                if k == "key" and isinstance(x, list) and flagged:
                    out[k] = key_list(x)
                elif isinstance(x, str) and k in ("payload", "row", "record"):
                    out[k] = _mask_json_text(x, rules)
                else:
                    out[k] = walk(x)
            return out
        if isinstance(v, list):
            if flagged and v and all(isinstance(x, list) and len(x) == len(key_columns) for x in v):
                return [key_list(x) for x in v]
            return [walk(x) for x in v]
        return v

    return mask_values(walk(values), rules)


def mask_diagnosis(diagnosis: Any, rules: Iterable[SensitiveRule]) -> Any:
    """A :class:`~dw_dagster.core.models.Diagnosis` whose evidence values and finding details are masked
    (what is recorded on the asset and shown anywhere else); everything else as it is."""
    rules = list(rules)
    causes = []
    for f in diagnosis.causes:
        keys = next((e.key_columns for e in f.evidence if e.key_columns), [])
        evidence = [e.model_copy(update={"values": mask_evidence_values(e.values, e.key_columns, rules)}) for e in f.evidence]
        details = mask_evidence_values(f.details, list(keys), rules)
        causes.append(f.model_copy(update={"evidence": evidence, "details": details}))
    return diagnosis.model_copy(update={"causes": causes})


def rules_in_force(domains: Any = None) -> list[SensitiveRule]:
    """The rules of the domains file in force (``domains``: a DomainsSource, default ``$DW_DOMAINS_FILE``),
    else the built-in ones; never fails (a broken domains file still masks with every built-in rule)."""
    from dw_dagster.core.domains import resolve_domains

    try:
        return rules_from(resolve_domains(domains))
    except Exception:  # noqa: BLE001 - masking never stops the evidence from being recorded, only its values
        return list(DEFAULT_RULES)


def masker(settings: SensitiveSettings | Domains | None):
    """``mask_values`` bound to the rules of ``settings`` (the domains file's ``review.sensitive``, else the
    built-in rules): what every outlet applies before evidence leaves the warehouse."""
    try:
        rules = rules_from(settings)
    except ValueError:
        rules = list(DEFAULT_RULES)  # a bad disable list still masks with every built-in rule
    return lambda values: mask_values(values, rules)


__all__ = ["DEFAULT_RULES", "MASKED_COLUMNS_KEY", "SensitiveMatch", "mask_diagnosis", "mask_evidence_values", "mask_keyed",
           "mask_row", "mask_rows", "mask_values", "rules_in_force",
           "masked_text", "masker", "match_column", "normalise_name", "rules_from", "sensitive_column"]
