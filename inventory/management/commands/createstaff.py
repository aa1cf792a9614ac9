"""Create the first staff superuser, non-interactively.

The password comes from ``FLASHSALE_ADMIN_PASSWORD``; without it a random one is generated and
printed once (it is stored only as a hash, so it cannot be shown again).
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

PASSWORD_ENV = "FLASHSALE_ADMIN_PASSWORD"


class Command(BaseCommand):
    help = f"Create a staff superuser; the password is ${PASSWORD_ENV} or a generated one printed once."

    def add_arguments(self, parser):
        parser.add_argument("--username", required=True)
        parser.add_argument("--email", default="")

    def handle(self, *args, username: str, email: str, **options):
        User = get_user_model()
        username = username.strip()
        if not username:
            raise CommandError("--username must not be empty")
        field = User._meta.get_field(User.USERNAME_FIELD)
        try:
            field.run_validators(username)  # its length and characters, as the admin's form checks them
        except ValidationError as exc:
            raise CommandError(f"--username {username[:40]!r}: {' '.join(exc.messages)}") from None
        email = email.strip()
        if email:
            try:
                User._meta.get_field("email").clean(email, None)  # its form and length, as the admin checks them
            except ValidationError as exc:
                raise CommandError(f"--email {email[:40]!r}: {' '.join(exc.messages)}") from None
        if User._default_manager.filter(**{User.USERNAME_FIELD: username}).exists():
            raise CommandError(
                f"user {username!r} already exists; set a new password with: manage.py changepassword {username}"
            )
        password = os.environ.get(PASSWORD_ENV, "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(18)
        user = User(**{User.USERNAME_FIELD: username}, email=email, is_staff=True, is_superuser=True)
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError(f"{PASSWORD_ENV} is not accepted: {' '.join(exc.messages)}") from None
        user.set_password(password)
        user.save()
        if generated:
            self.stdout.write(f"created staff superuser {username!r} with password: {password}")
            self.stdout.write("this password is shown only once; keep it somewhere safe")
        else:
            self.stdout.write(f"created staff superuser {username!r} with the password from ${PASSWORD_ENV}")
