"""Settings that point the jobs somewhere unusable stop the server at start-up, fast, in one
line that never shows a password; ``python -m service.settings_check`` catches them first."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.settings import Settings

PASSWORD = "hunter2-secret"


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (f"mysql://lead:{PASSWORD}@db:3306/lead", "a mysql:// URL"),
        (f"postgresql+psycopg://lead:{PASSWORD}@db/lead", "a postgresql+psycopg:// URL"),
        (f"sqlite:///{PASSWORD}.db", "a sqlite:// URL"),
        (f"lead:{PASSWORD}@db/lead", "not a URL"),
    ],
)
def test_a_database_url_that_is_not_postgresql_is_refused_without_its_password(
    url: str, named: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(database_url=url)
    text = str(caught.value)
    assert "database_url must be a PostgreSQL URL" in text and named in text
    assert PASSWORD not in text


def test_a_postgresql_url_and_an_empty_one_are_accepted() -> None:
    url = f"postgres://lead:{PASSWORD}@db:5432/lead"
    settings = Settings(database_url=url)
    assert settings.database_url is not None and settings.database_url.get_secret_value() == url
    assert Settings(database_url="").database_url is None
