"""Page-number pagination with a client-chosen page size (bounded)."""

from rest_framework.pagination import PageNumberPagination


class Pages(PageNumberPagination):
    page_size = 25
    page_size_query_param = "page_size"
    max_page_size = 200
