"""Request body parsers of the API: JSON nested deeper than Python's parser can follow is a 400, not a 500."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser


class JSONBodyParser(JSONParser):
    """DRF's JSON parser; it turns ValueError into a 400 but lets RecursionError ("[[[[..." bodies) through."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


# DRF's default parsers with the JSON one replaced; views that read a body use these.
API_PARSERS = [JSONBodyParser, FormParser, MultiPartParser]
