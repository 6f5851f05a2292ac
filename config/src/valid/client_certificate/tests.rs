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
