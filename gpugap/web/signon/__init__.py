"""Sign-on for ``gpugap web``: who is asking, and what they may see.

Two ways to know who asks (``GPUGAP_WEB_SIGNON_MODE``): OpenID Connect (``oidc.py``: the
authorization code flow with PKCE, state and nonce, a server-side session behind an HttpOnly
cookie, ``sessions.py``) or a trusted authenticating proxy's headers (``proxy.py``: oauth2-proxy's
``X-Forwarded-User``/``-Email``/``-Groups``, only from the configured proxy addresses). ``roles.py``
maps the person's groups to a role: admin (everything), a team's lead (the team), a user (their
own jobs and their team's totals). The warehouse enforces it: every query of a lead or a user
carries their scope to the embedded endpoint, whose row policies read it
(warehouse/embedded/scopes.py); the page's own code filters nothing.
"""
