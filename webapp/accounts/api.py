"""REST API of accounts: exchange a password for a token, revoke it, list the caller's teams."""

from __future__ import annotations

from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import permissions, serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.accounts.models import ApiToken, Membership, Team
from webapp.accounts.throttle import SCOPE, LoginRateThrottle
from webapp.api_errors import FieldErrors
from webapp.parsers import API_PARSERS


class TokenRequestSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, trim_whitespace=False)
    name = serializers.CharField(max_length=100, required=False, default="cli", help_text="a label for the token")


class TokenView(APIView):
    """POST {username, password} -> {token}; DELETE (with the token) revokes it."""

    permission_classes = [permissions.AllowAny]
    parser_classes = API_PARSERS
    throttle_scope = SCOPE
    throttle_classes = [LoginRateThrottle]

    def get_permissions(self) -> list[permissions.BasePermission]:
        if self.request.method == "DELETE":
            return [permissions.IsAuthenticated()]
        return super().get_permissions()

    @extend_schema(request=TokenRequestSerializer,
                   responses={200: inline_serializer("TokenResponse", {"token": serializers.CharField()})})
    def post(self, request: Request) -> Response:
        form = TokenRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        user = authenticate(request, username=form.validated_data["username"], password=form.validated_data["password"])
        if user is None or not user.is_active:
            raise FieldErrors([{"field": "password", "message": "unknown username or wrong password", "allowed": None}])
        _, key = ApiToken.issue(user, form.validated_data["name"])
        return Response({"token": key, "username": user.username})

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request) -> Response:
        if isinstance(request.auth, ApiToken):
            request.auth.revoke()
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "role"]

    def get_role(self, team: Team) -> str:
        member = Membership.objects.filter(team=team, user=self.context["request"].user).first()
        return member.role if member else ""


class TeamListView(ListAPIView):
    """The teams the caller belongs to, with the caller's role in each."""

    serializer_class = TeamSerializer

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Team.objects.filter(memberships__user=self.request.user).distinct()
