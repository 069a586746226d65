"""The web role's application: Django behind the request body limits (orchestrator.api.limits)."""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from lumastra import config
from orchestrator.api.limits import BodyLimit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
CONFIG = config.current()
application = BodyLimit(
    get_asgi_application(),
    api_limit=CONFIG.api_max_body_bytes,
    site_limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
    read_timeout_s=CONFIG.web_read_timeout_s,
)
