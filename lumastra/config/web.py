"""The web role's settings (HTTP, the API, the admin's security headers, /metrics, the event
streams) and Flower's."""

from __future__ import annotations

from dataclasses import dataclass

from lumastra.config import env


def _parse_trace_url(raw: str) -> str:
    value = raw.strip()
    if value and "{trace_id}" not in value:
        raise ValueError(f"expected a URL with {{trace_id}} in it, got {raw!r}")
    return value


@dataclass(frozen=True)
class Web:
    allowed_hosts: tuple[str, ...] = env.variable(
        "LUMASTRA_ALLOWED_HOSTS",
        "localhost,127.0.0.1",
        env.parse_list,
        "comma-separated hosts",
        roles=env.WEB,
    )
    csrf_trusted_origins: tuple[str, ...] = env.variable(
        "LUMASTRA_CSRF_TRUSTED_ORIGINS",
        "",
        env.parse_list,
        "origins trusted for unsafe requests",
        roles=env.WEB,
    )
    trace_url: str = env.variable(
        "LUMASTRA_TRACE_URL",
        "",
        _parse_trace_url,
        "a run page links its trace here ({trace_id} replaced, e.g. "
        "http://jaeger:16686/trace/{trace_id}); empty: the id only",
        roles=env.WEB,
    )
    https: bool = env.variable(
        "LUMASTRA_HTTPS",
        "false",
        env.parse_bool,
        "served over HTTPS: secure cookies, redirect",
        roles=env.WEB,
    )
    proxy_ssl_header: bool = env.variable(
        "LUMASTRA_PROXY_SSL_HEADER",
        "false",
        env.parse_bool,
        "trust X-Forwarded-Proto from the TLS-terminating proxy",
        roles=env.WEB,
    )
    hsts_seconds: int = env.variable(
        "LUMASTRA_HSTS_SECONDS",
        "0",
        env.non_negative_int,
        "Strict-Transport-Security max-age",
        roles=env.WEB,
    )
    hsts_include_subdomains: bool = env.variable(
        "LUMASTRA_HSTS_INCLUDE_SUBDOMAINS",
        "false",
        env.parse_bool,
        "HSTS includeSubDomains",
        roles=env.WEB,
    )
    hsts_preload: bool = env.variable(
        "LUMASTRA_HSTS_PRELOAD", "false", env.parse_bool, "HSTS preload", roles=env.WEB
    )
    web_host: str = env.variable(
        "LUMASTRA_WEB_HOST", "127.0.0.1", str, "address the web role binds", roles=env.WEB
    )
    web_port: int = env.variable(
        "LUMASTRA_WEB_PORT", "8000", env.positive_int, "port the web role serves on", roles=env.WEB
    )
    api_max_body_bytes: int = env.variable(
        "LUMASTRA_API_MAX_BODY_BYTES",
        "262144",
        env.positive_int,
        "largest accepted API request body",
        roles=env.WEB,
    )
    auth_failure_limit: int = env.variable(
        "LUMASTRA_AUTH_FAILURE_LIMIT",
        "10",
        env.positive_int,
        "failed sign-ins (API token or admin login) per client address per window",
        roles=env.WEB,
    )
    auth_failure_window_s: int = env.variable(
        "LUMASTRA_AUTH_FAILURE_WINDOW_S",
        "300",
        env.positive_int,
        "seconds from an address's first failed sign-in in which its failures are counted",
        roles=env.WEB,
    )
    web_read_timeout_s: int = env.variable(
        "LUMASTRA_WEB_READ_TIMEOUT_S",
        "15",
        env.positive_int,
        "seconds a client has to send a request's headers, and again its body",
        roles=env.WEB,
    )
    web_keep_alive_s: int = env.variable(
        "LUMASTRA_WEB_KEEP_ALIVE_S",
        "5",
        env.positive_int,
        "idle keep-alive connection lifetime",
        roles=env.WEB,
    )
    web_limit_concurrency: int = env.variable(
        "LUMASTRA_WEB_LIMIT_CONCURRENCY",
        "1000",
        env.positive_int,
        "connections or requests at once before the web role answers 503",
        roles=env.WEB,
    )
    web_max_header_bytes: int = env.variable(
        "LUMASTRA_WEB_MAX_HEADER_BYTES",
        "32768",
        env.positive_int,
        "largest request head",
        roles=env.WEB,
    )
    flower_url: str = env.variable(
        "LUMASTRA_FLOWER_URL",
        "http://127.0.0.1:5555",
        str,
        "where operators reach Flower",
        roles=env.WEB,
    )
    metrics_token: str = env.variable(
        "LUMASTRA_METRICS_TOKEN",
        "",
        str,
        "bearer token /metrics asks for; unset: /metrics is disabled",
        roles=env.WEB,
    )
    metrics_cache_s: float = env.variable(
        "LUMASTRA_METRICS_CACHE_S",
        "5",
        env.non_negative_seconds,
        "seconds a /metrics body is kept in the cache Valkey for every web replica; 0: never",
        roles=env.WEB,
    )
    trigger_tolerance_s: int = env.variable(
        "LUMASTRA_TRIGGER_TOLERANCE_S",
        "300",
        env.positive_int,
        "seconds a signed trigger request's timestamp may be from now; a replay is refused "
        "for as long",
        roles=env.WEB,
    )
    sse_keepalive_s: int = env.variable(
        "LUMASTRA_SSE_KEEPALIVE_S",
        "15",
        env.positive_int,
        "seconds between keep-alive comments on an idle event stream",
        roles=env.WEB,
    )


@dataclass(frozen=True)
class Flower:
    # Flower's own name, which Flower also reads itself (like CELERY_BROKER_URL, Celery's).
    flower_basic_auth: tuple[str, ...] = env.variable(
        "FLOWER_BASIC_AUTH",
        "",
        env.parse_list,
        "Flower's user:password pairs, comma-separated",
        roles=env.FLOWER,
        required=True,
    )
