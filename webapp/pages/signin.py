"""The sign-in page: Django's login view, refusing an address (429) after too many failed attempts."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.http import HttpResponse

from webapp.accounts.throttle import FailedSignIns


class ThrottledAuthenticationForm(AuthenticationForm):
    """Checks the password only while the address has failed fewer times than the login rate allows."""

    def clean(self) -> dict[str, Any]:
        failures = FailedSignIns(self.request)
        if failures.blocked():
            raise ValidationError(f"Too many failed sign-ins from your address: wait up to {failures.period} seconds, "
                                  "then try again.", code="throttled")
        try:
            return super().clean()
        except ValidationError:
            failures.record()
            raise


class SignInView(LoginView):
    form_class = ThrottledAuthenticationForm
    template_name = "login.html"
    redirect_authenticated_user = True

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        if form.has_error(NON_FIELD_ERRORS, "throttled"):
            response.status_code = 429
        return response
