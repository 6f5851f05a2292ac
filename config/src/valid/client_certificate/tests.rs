use super::*;

/// A self-signed certificate and its key (PKCS#8 PEM), of the algorithm given.
fn pair(alg: &'static rcgen::SignatureAlgorithm) -> (String, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate_for(alg).expect("key");
    let cert = rcgen::CertificateParams::new(vec!["client.test".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    (cert.pem(), key)
}

fn identity(chain: &str, key: &str) -> Result<ClientIdentity, Invalid> {
    ClientIdentity::new(&ClientCertificate {
        certificate_chain: chain.to_owned(),
        private_key: key.to_owned(),
    })
}

#[test]
fn a_key_is_matched_to_its_certificate_for_each_algorithm() {
    for alg in [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ECDSA_P521_SHA512,
        &rcgen::PKCS_ED25519,
        &rcgen::PKCS_RSA_SHA256,
    ] {
        let (cert, key) = pair(alg);
        let (other_cert, other_key) = pair(alg);
        let ok = identity(&cert, &key.serialize_pem()).expect("its own key matches");
        assert_eq!(ok.chain.len(), 1);
        assert_eq!(ok.key().secret_der(), key.serialize_der().as_slice());
        // Ed25519 PKCS#8 v1 keys carry no public key: they are matched by the proxy's TLS
        // library instead.
        if *alg == rcgen::PKCS_ED25519 && public_key(&ok.key()).ok().flatten().is_none() {
            continue;
        }
        let err = identity(&cert, &other_key.serialize_pem()).expect_err("another key");
        assert_eq!(err.field, KEY, "{alg:?}");
        assert!(err.message.contains("does not belong"), "{}", err.message);
        identity(&other_cert, &other_key.serialize_pem()).expect("the other pair matches");
    }
}

#[test]
fn pkcs1_and_sec1_keys_are_matched_too() {
    use rustls_pki_types::pem::PemObject as _;
    let (cert, key) = pair(&rcgen::PKCS_RSA_SHA256);
    let (_, other) = pair(&rcgen::PKCS_RSA_SHA256);
    // A PKCS#8 RSA key holds the PKCS#1 key as its private key octets.
    let pkcs1 = |k: &rcgen::KeyPair| {
        let inner = yasna::parse_der(&k.serialize_der(), |r| {
            r.read_sequence(|r| {
                r.next().read_der()?;
                r.next().read_der()?;
                let inner = r.next().read_bytes()?;
                r.read_optional(|r| r.read_der())?;
                Ok(inner)
            })
        })
        .expect("PKCS#8");
        let der = PrivateKeyDer::Pkcs1(inner.into());
        pem("RSA PRIVATE KEY", der.secret_der())
    };
    identity(&cert, &pkcs1(&key)).expect("PKCS#1 key of the certificate");
    assert_eq!(
        identity(&cert, &pkcs1(&other)).expect_err("another").field,
        KEY
    );
    let parsed = PrivateKeyDer::from_pem_slice(pkcs1(&key).as_bytes()).expect("PEM");
    assert!(matches!(parsed, PrivateKeyDer::Pkcs1(_)));
}

fn pem(tag: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|l| std::str::from_utf8(l).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN {tag}-----\n{}\n-----END {tag}-----\n",
        lines.join("\n")
    )
}

#[test]
fn broken_chains_and_keys_name_their_field() {
    let (cert, key) = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
    let key = key.serialize_pem();
    let cases = [
        ("", key.as_str(), CHAIN, "no PEM certificate"),
        ("not pem", key.as_str(), CHAIN, "no PEM certificate"),
        (
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            key.as_str(),
            CHAIN,
            "not valid X.509",
        ),
        (cert.as_str(), "", KEY, "no PEM private key"),
        (cert.as_str(), cert.as_str(), KEY, "no PEM private key"),
        (
            cert.as_str(),
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            KEY,
            "not a valid",
        ),
    ];
    for (chain, key, field, message) in cases {
        let err = identity(chain, key).expect_err("refused");
        assert_eq!(err.field, field, "{chain:?} / {key:?}: {err:?}");
        assert!(err.message.contains(message), "{err:?}");
    }
}

#[test]
fn the_key_never_shows_in_debug_output() {
    let (cert, key) = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
    let doc = ClientCertificate {
        certificate_chain: cert.clone(),
        private_key: key.serialize_pem(),
    };
    assert!(!format!("{doc:?}").contains("PRIVATE KEY"));
    let checked = ClientIdentity::new(&doc).expect("valid");
    assert!(!format!("{checked:?}").contains("PRIVATE"));
}

/// A 1024-bit RSA key and its self-signed certificate (made with `openssl req -x509 -newkey
/// rsa:1024`).
const RSA_1024: (&str, &str) = (
    "-----BEGIN CERTIFICATE-----\nMIICCjCCAXOgAwIBAgIURY8Ox/XCmSJ2Y3L/Nz+jW8Qm2C0wDQYJKoZIhvcNAQEL\nBQAwFjEUMBIGA1UEAwwLY2xpZW50LnRlc3QwIBcNMjYxMjA2MDgyOTE2WhgPMjEy\nNjExMTIwODI5MTZaMBYxFDASBgNVBAMMC2NsaWVudC50ZXN0MIGfMA0GCSqGSIb3\nDQEBAQUAA4GNADCBiQKBgQCilk7D3qAH8eqgBwCNmlQ1waqmXssPQ9wqBoRAOMtQ\noSX9cnwBbG1DxIIGUA8aqzPZjMkdjdkB02rbf/oKHlNKATx5KnPIKITRf5BMnSsL\nfkoUrAMOOSxJgKTzON8lvkoL2u3q7BHmQu1KirtmWJuHgSxiAvjjm/WSCne78PST\nkQIDAQABo1MwUTAdBgNVHQ4EFgQU55KXlQ0pX+NgoZUs+U0x3hCDR90wHwYDVR0j\nBBgwFoAU55KXlQ0pX+NgoZUs+U0x3hCDR90wDwYDVR0TAQH/BAUwAwEB/zANBgkq\nhkiG9w0BAQsFAAOBgQBVp9SBCfeQLHYQ8IsckDo+26H9ET/MYs+2EF/vIEtxfBs8\nZk7c1ZiZjOR/bVQA1BXkWCV+73Q9KyXguzTyw1AWoR3KtQF4kI94fUIsDdegK19T\ntL3NpFNjrYL8CHIBQL8RdIL2SG4aEAq8xiR4+wbsJHPH2kr5inN4vnFK/KHt8A==\n-----END CERTIFICATE-----",
    "-----BEGIN PRIVATE KEY-----\nMIICdwIBADANBgkqhkiG9w0BAQEFAASCAmEwggJdAgEAAoGBAKKWTsPeoAfx6qAH\nAI2aVDXBqqZeyw9D3CoGhEA4y1ChJf1yfAFsbUPEggZQDxqrM9mMyR2N2QHTatt/\n+goeU0oBPHkqc8gohNF/kEydKwt+ShSsAw45LEmApPM43yW+Sgva7ersEeZC7UqK\nu2ZYm4eBLGIC+OOb9ZIKd7vw9JORAgMBAAECgYAccgOxzR9ehHqyKMd1/sxA43NB\nzE/mic7ZI2679bPMlYUaBI+hiCDNvHGrPRKHbfCSXUlKfGi9IwoNASTz5D5Z6sBE\nCHpUwbfPoOTPjBPRz3BphL5vG1E/auzfehOEZGwHQlHX2Ft+npz8eWYAvQExQ0Vi\nA1rWjVKeFbZxqVUnCQJBANgEU+GgaC9uDgBMpEK6waTkTUZoP6/XRnJLvM9/3GhC\nXcMMwi2sp158T91os9EdaPB6cS8JK0jOw1SKB2URT1MCQQDArkgv5pfVcUqaibWj\n6H+3243bZwMCmpDqzC/e99AxF4oMx+GmhT2YUMJzCgrr1MlPk1MBSR5xwgmDJTlO\nmskLAkBYPJxO44jrJtdNRAEsyMBkrGTsR5UMLLE36rv7Pk03wTQvgjynD4lmTP0K\ngcRBvPOqlzk4b1Rg7yRWmfMfU4zFAkEAqf4ZOgmbk3hsdYNheca6R5+wvA1aHoX3\nrO+QnIrOZ0F5TmVas+uBuEwoAg6uK/qD0W0NImk8LukeM1I4CR2OmQJBAK+PXOfu\nROY7ZlKSzscVdNPlgLx2aqcOp+3Zhk6xe3sFvnwOW+X7awc/0QBNM8eWNdnq5Blc\niMkV+XbNbpWkrCo=\n-----END PRIVATE KEY-----",
);

/// A secp256k1 key (PKCS#8) and its self-signed certificate.
const SECP256K1: (&str, &str) = (
    "-----BEGIN CERTIFICATE-----\nMIIBfzCCASagAwIBAgIUGqSlxbZ/j0jX+XOqp663Ros7lxEwCgYIKoZIzj0EAwIw\nFjEUMBIGA1UEAwwLY2xpZW50LnRlc3QwIBcNMjYxMjA2MDgyOTE2WhgPMjEyNjEx\nMTIwODI5MTZaMBYxFDASBgNVBAMMC2NsaWVudC50ZXN0MFYwEAYHKoZIzj0CAQYF\nK4EEAAoDQgAE5SNnSMYniY5/BuyDIBRmtPeHySHuhNMjVRNWzfx4LhNjYkXWVWTY\nYWKVjilmj0ZUu5Mlcyuliv8O3lwjpghgVqNTMFEwHQYDVR0OBBYEFG5sWH5tpUQl\nOhsRUUckuRvSfVouMB8GA1UdIwQYMBaAFG5sWH5tpUQlOhsRUUckuRvSfVouMA8G\nA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIgPKQTOBA+IRsSHdU3tqim\nYsTnTa7hnSy1gQr2DY+HU9oCIGNFR6V1PhqGxFItZ2uv/gT9Jc4r4xvpFZmZDMcR\nhYeK\n-----END CERTIFICATE-----",
    "-----BEGIN PRIVATE KEY-----\nMIGEAgEAMBAGByqGSM49AgEGBSuBBAAKBG0wawIBAQQgCDhhLq9AAcKiukuS/wzV\nRangjggx3t7onSfH83aZcHKhRANCAATlI2dIxieJjn8G7IMgFGa094fJIe6E0yNV\nE1bN/HguE2NiRdZVZNhhYpWOKWaPRlS7kyVzK6WK/w7eXCOmCGBW\n-----END PRIVATE KEY-----",
);

/// The secp256k1 key of [`SECP256K1`] without its public point: its curve is named only in
/// its algorithm's parameters.
const SECP256K1_NO_POINT: &str = "-----BEGIN PRIVATE KEY-----\nMD4CAQAwEAYHKoZIzj0CAQYFK4EEAAoEJzAlAgEBBCAIOGEur0ABwqK6S5L/DNVF\nqeCOCDHe3uidJ8fzdplwcg==\n-----END PRIVATE KEY-----";

#[test]
fn keys_the_proxys_tls_library_cannot_sign_with_are_refused() {
    for (what, (cert, key), says) in [
        ("RSA 1024", RSA_1024, "an RSA key of 1024 bits"),
        ("secp256k1", SECP256K1, "an EC key on curve 1.3.132.0.10"),
        (
            "secp256k1 without its point",
            (SECP256K1.0, SECP256K1_NO_POINT),
            "an EC key on curve 1.3.132.0.10",
        ),
    ] {
        let err = identity(cert, key).expect_err(what);
        assert_eq!(err.field, KEY, "{what}");
        assert!(
            err.message.contains("cannot sign with") && err.message.contains(says),
            "{what}: {}",
            err.message
        );
    }
}
