"""Mints buyer tokens the way a shop's identity provider does, with PyJWT
(an independent JWT library), for tests/tests/gateway_provider_keys.rs.

Writes, into the directory given as the first argument:
  provider.jwks  - a JWKS shaped like Keycloak's, Auth0's or Okta's published
                   keys: two RSA signing keys with certificate chains (x5c),
                   one RSA encryption key (use "enc"), one EC P-256 key;
  rotated.jwks   - the same provider after a rotation: the second RSA key gone;
  tokens.json    - {name: token}: good tokens for each signing key and
                   forgeries (wrong key, alg swapped to HS256 with the public
                   key as the secret in PEM, DER and as the JWK's n, alg none,
                   wrong issuer).

Usage: provider_tokens.py DIR AUDIENCE ISSUER
"""

import base64
import datetime
import hashlib
import hmac
import json
import sys
import time

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)
from cryptography.x509.oid import NameOID


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def cert_chain(key, name: str) -> list:
    """A self-signed certificate of key's public half, as x5c holds it."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    return [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]


def rsa_jwk(key, kid: str, use: str) -> dict:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "use": use, "alg": "RS256" if use == "sig" else "RSA-OAEP"})
    jwk["x5c"] = cert_chain(key, kid)
    jwk["x5t"] = b64(hashlib.sha1(base64.b64decode(jwk["x5c"][0])).digest())
    return jwk


def hs256_forgery(claims: dict, kid: str, secret: bytes) -> str:
    """An HS256 token whose "secret" is public key material (PyJWT refuses
    to HMAC with a PEM public key, so it is built by hand)."""
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = b64(json.dumps(claims).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


def main() -> None:
    out, aud, iss = sys.argv[1], sys.argv[2], sys.argv[3]
    rsa1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa2 = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    enc = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec1 = ec.generate_private_key(ec.SECP256R1())
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec1.public_key()))
    ec_jwk.update({"kid": "ec1", "use": "sig", "alg": "ES256"})
    provider = {"keys": [rsa_jwk(rsa1, "rsa1", "sig"), rsa_jwk(rsa2, "rsa2", "sig"),
                         rsa_jwk(enc, "enc1", "enc"), ec_jwk]}
    rotated = {"keys": [k for k in provider["keys"] if k["kid"] != "rsa2"]}
    with open(f"{out}/provider.jwks", "w") as f:
        json.dump(provider, f)
    with open(f"{out}/rotated.jwks", "w") as f:
        json.dump(rotated, f)

    now = int(time.time())

    def claims(sub: str, issuer: str = iss) -> dict:
        return {"sub": sub, "aud": aud, "iss": issuer, "iat": now, "exp": now + 600}

    public_pem = rsa1.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    public_der = rsa1.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    n_bytes = rsa1.public_key().public_numbers().n.to_bytes(256, "big")
    tokens = {
        "rs256_rsa1": jwt.encode(claims("buyer-rsa1"), rsa1, "RS256", headers={"kid": "rsa1"}),
        "rs256_rsa2": jwt.encode(claims("buyer-rsa2"), rsa2, "RS256", headers={"kid": "rsa2"}),
        "es256_ec1": jwt.encode(claims("buyer-ec1"), ec1, "ES256", headers={"kid": "ec1"}),
        "forged_wrong_key": jwt.encode(claims("buyer-rsa1"), stranger, "RS256",
                                       headers={"kid": "rsa1"}),
        "forged_hs256_pem": hs256_forgery(claims("buyer-x"), "rsa1", public_pem),
        "forged_hs256_der": hs256_forgery(claims("buyer-x"), "rsa1", public_der),
        "forged_hs256_n": hs256_forgery(claims("buyer-x"), "rsa1", n_bytes),
        "forged_none": jwt.encode(claims("buyer-x"), None, "none", headers={"kid": "rsa1"}),
        "forged_es256_as_rs256": jwt.encode(claims("buyer-x"), ec1, "ES256",
                                            headers={"kid": "rsa1"}),
        "wrong_issuer": jwt.encode(claims("buyer-iss", "https://evil.example/"), rsa1, "RS256",
                                   headers={"kid": "rsa1"}),
        "enc_key_kid": jwt.encode(claims("buyer-enc"), enc, "RS256", headers={"kid": "enc1"}),
        # The forger's own keys offered by address in the header (jku,
        # x5u): never fetched nor trusted.
        "forged_jku_x5u": jwt.encode(
            claims("buyer-x"), stranger, "RS256",
            headers={"kid": "rsa1", "jku": "http://127.0.0.1:9/jwks.json",
                     "x5u": "http://127.0.0.1:9/cert.pem"}),
        # A real token of ec1 with a crit extension the gateway does not know.
        "crit_extension": jwt.encode(claims("buyer-crit"), ec1, "ES256",
                                     headers={"kid": "ec1", "crit": ["exp-ext"],
                                              "exp-ext": "1"}),
    }
    # ec1's real token with its signature in DER instead of r || s
    # (RFC 7518 3.4), with a zero signature, and with `alg` in lower case.
    head, body, sig = tokens["es256_ec1"].split(".")
    raw = base64.urlsafe_b64decode(sig + "==")
    r, s_ = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")
    tokens["es256_der_signature"] = f"{head}.{body}.{b64(encode_dss_signature(r, s_))}"
    tokens["es256_zero_signature"] = f"{head}.{body}.{b64(bytes(64))}"
    lower = b64(json.dumps({"alg": "es256", "kid": "ec1", "typ": "JWT"}).encode())
    signing_input = f"{lower}.{body}".encode()
    r2, s2 = decode_dss_signature(ec1.sign(signing_input, ec.ECDSA(hashes.SHA256())))
    tokens["es256_lowercase_alg"] = (
        f"{lower}.{body}.{b64(r2.to_bytes(32, 'big') + s2.to_bytes(32, 'big'))}")
    with open(f"{out}/tokens.json", "w") as f:
        json.dump(tokens, f)


if __name__ == "__main__":
    main()
