//! The client certificate a backend may ask for (mutual TLS): its chain and key parsed, and
//! the key checked against the first certificate, here rather than at the first handshake.
//!
//! Pure: the key is matched by the public key it carries (RSA keys always do; EC and Ed25519
//! keys usually), compared with the certificate's, so no crypto library is needed. A key that
//! carries no public key cannot be matched here; the proxy's TLS library matches it when it
//! builds the backend's client, and refuses the document then.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use yasna::models::ObjectIdentifier;
use yasna::{ASN1Result, DERWriter, Tag};

use super::Invalid;
use crate::ClientCertificate;

const CHAIN: &str = "tls.clientCertificate.certificateChain";
const KEY: &str = "tls.clientCertificate.privateKey";

/// `rsaEncryption` (RFC 8017).
const RSA: &[u64] = &[1, 2, 840, 113_549, 1, 1, 1];
/// `id-ecPublicKey` (RFC 5480).
const EC: &[u64] = &[1, 2, 840, 10_045, 2, 1];

/// A client certificate chain and its key, checked.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The certificate first, then its intermediates.
    pub chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

/// The key is left out.
impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl ClientIdentity {
    /// Parses and checks a client certificate.
    ///
    /// # Errors
    /// A chain with no PEM certificate, or one that is not an X.509 certificate; a key that is
    /// not one PEM private key (PKCS#8, PKCS#1 or SEC1), whose public key is not the first
    /// certificate's, or of a type or size the proxy's TLS library cannot sign with.
    pub fn new(c: &ClientCertificate) -> Result<Self, Invalid> {
        let mut chain = Vec::new();
        for (i, cert) in CertificateDer::pem_slice_iter(c.certificate_chain.as_bytes()).enumerate()
        {
            let cert = cert.map_err(|e| Invalid::new(CHAIN, e.to_string()))?;
            webpki::EndEntityCert::try_from(&cert).map_err(|e| {
                Invalid::new(CHAIN, format!("certificate {i} is not valid X.509: {e}"))
            })?;
            chain.push(cert);
        }
        let Some(leaf) = chain.first() else {
            return Err(Invalid::new(CHAIN, "no PEM certificate found"));
        };
        let key = PrivateKeyDer::from_pem_slice(c.private_key.as_bytes())
            .map_err(|e| Invalid::new(KEY, format!("no PEM private key: {e}")))?;
        let carried = public_key(&key).map_err(|e| {
            Invalid::new(KEY, format!("not a valid PKCS#8, PKCS#1 or SEC1 key: {e}"))
        })?;
        if let Some(spki) = &carried {
            let leaf = webpki::EndEntityCert::try_from(leaf)
                .map_err(|e| Invalid::new(CHAIN, e.to_string()))?;
            if *leaf.subject_public_key_info() != *spki {
                return Err(Invalid::new(
                    KEY,
                    format!("the key does not belong to the first certificate of {CHAIN}"),
                ));
            }
        }
        // A key the proxy's TLS library cannot load is refused here, where the Gateway can
        // say so, not rule by rule at every push.
        if let Some(why) = unsupported(&key, carried.as_deref()) {
            return Err(Invalid::new(
                KEY,
                format!("a key the proxy cannot sign with: {why}"),
            ));
        }
        Ok(Self {
            chain,
            key: Arc::new(key),
        })
    }

    /// The private key.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

/// The OIDs of the curves and algorithms the proxy's TLS library (rustls on aws-lc-rs) signs
/// with besides RSA: ECDSA on P-256, P-384 and P-521, Ed25519, and ML-DSA.
const P256: &[u64] = &[1, 2, 840, 10_045, 3, 1, 7];
const P384: &[u64] = &[1, 3, 132, 0, 34];
const P521: &[u64] = &[1, 3, 132, 0, 35];
const ED25519: &[u64] = &[1, 3, 101, 112];
const ML_DSA_44: &[u64] = &[2, 16, 840, 1, 101, 3, 4, 3, 17];
const ML_DSA_65: &[u64] = &[2, 16, 840, 1, 101, 3, 4, 3, 18];
const ML_DSA_87: &[u64] = &[2, 16, 840, 1, 101, 3, 4, 3, 19];
/// The RSA modulus sizes it takes, in bits.
const RSA_BITS: std::ops::RangeInclusive<usize> = 2048..=8192;

/// Why the proxy's TLS library cannot sign with `key`, whose public key is `spki` (when it
/// carries one), if it cannot: it takes RSA keys of 2048 to 8192 bits, ECDSA keys on P-256,
/// P-384 and P-521, Ed25519 and ML-DSA keys. Read from the DER, as the core does no crypto.
fn unsupported(key: &PrivateKeyDer<'_>, spki: Option<&[u8]>) -> Option<String> {
    let (algorithm, parameter, public) = match spki {
        Some(spki) => yasna::parse_der(spki, |r| {
            r.read_sequence(|r| {
                let (algorithm, parameter) = r.next().read_sequence(|r| {
                    let oid = r.next().read_oid()?;
                    let parameter = r.read_optional(|r| r.read_der())?;
                    Ok((oid, parameter))
                })?;
                let public = r.next().read_bitvec_bytes()?.0;
                Ok((oid_of(algorithm), parameter, Some(public)))
            })
        })
        .ok()?,
        // A PKCS#8 key that carries no public key (Ed25519's and ML-DSA's, an EC key without
        // its point): its algorithm, and its curve if EC, are still named.
        None => match key {
            PrivateKeyDer::Pkcs8(k) => yasna::parse_der(k.secret_pkcs8_der(), |r| {
                r.read_sequence(|r| {
                    r.next().read_der()?;
                    let (algorithm, parameter) = r.next().read_sequence(|r| {
                        let oid = r.next().read_oid()?;
                        let parameter = r.read_optional(|r| r.read_der())?;
                        Ok((oid, parameter))
                    })?;
                    r.next().read_der()?;
                    r.read_optional(|r| r.read_tagged_implicit(Tag::context(0), |r| r.read_der()))?;
                    Ok((oid_of(algorithm), parameter, None))
                })
            })
            .ok()?,
            _ => return None,
        },
    };
    match algorithm.as_slice() {
        RSA => {
            let modulus = yasna::parse_der(&public?, |r| {
                r.read_sequence(|r| {
                    let modulus = r.next().read_bigint_bytes()?.0;
                    r.next().read_der()?;
                    Ok(modulus)
                })
            })
            .ok()?;
            let first = modulus.iter().position(|b| *b != 0)?;
            let bits = (modulus.len() - first) * 8 - modulus[first].leading_zeros() as usize;
            (!RSA_BITS.contains(&bits)).then(|| {
                format!(
                    "an RSA key of {bits} bits (RSA keys of {} to {} bits are taken)",
                    RSA_BITS.start(),
                    RSA_BITS.end()
                )
            })
        }
        EC => {
            let curve = oid_of(yasna::parse_der(&parameter?, |r| r.read_oid()).ok()?);
            (![P256, P384, P521].contains(&curve.as_slice())).then(|| {
                format!(
                    "an EC key on curve {} (P-256, P-384 and P-521 are taken)",
                    dotted(&curve)
                )
            })
        }
        ED25519 | ML_DSA_44 | ML_DSA_65 | ML_DSA_87 => None,
        other => Some(format!(
            "a key of algorithm {} (RSA, ECDSA, Ed25519 and ML-DSA keys are taken)",
            dotted(other)
        )),
    }
}

fn dotted(oid: &[u64]) -> String {
    oid.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
}

/// The SubjectPublicKeyInfo (DER) of the public key `key` carries; `None` when it carries none.
fn public_key(key: &PrivateKeyDer<'_>) -> ASN1Result<Option<Vec<u8>>> {
    match key {
        PrivateKeyDer::Pkcs1(k) => rsa(k.secret_pkcs1_der()).map(Some),
        PrivateKeyDer::Sec1(k) => {
            let (curve, point) = sec1(k.secret_sec1_der())?;
            Ok(curve.zip(point).map(|(curve, point)| ec(&curve, &point)))
        }
        PrivateKeyDer::Pkcs8(k) => pkcs8(k.secret_pkcs8_der()),
        _ => Ok(None),
    }
}

/// An RSA key's SubjectPublicKeyInfo, from its PKCS#1 `RSAPrivateKey` (RFC 8017 A.1.2).
fn rsa(der: &[u8]) -> ASN1Result<Vec<u8>> {
    let (modulus, exponent) = yasna::parse_der(der, |r| {
        r.read_sequence(|r| {
            r.next().read_der()?; // version
            let modulus = r.next().read_der()?;
            let exponent = r.next().read_der()?;
            for _ in 0..6 {
                r.next().read_der()?;
            }
            r.read_optional(|r| r.read_der())?; // otherPrimeInfos
            Ok((modulus, exponent))
        })
    })?;
    let public = yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_der(&modulus);
            w.next().write_der(&exponent);
        });
    });
    Ok(spki(
        |w| {
            w.next().write_oid(&ObjectIdentifier::from_slice(RSA));
            w.next().write_null();
        },
        &public,
    ))
}

/// An EC key's curve and public point (a BIT STRING's bytes), from its SEC1 `ECPrivateKey`
/// (RFC 5915); either may be absent.
fn sec1(der: &[u8]) -> ASN1Result<(Option<ObjectIdentifier>, Option<Vec<u8>>)> {
    yasna::parse_der(der, |r| {
        r.read_sequence(|r| {
            r.next().read_der()?; // version
            r.next().read_bytes()?; // privateKey
            let curve = r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_oid()))?;
            let point = r.read_optional(|r| {
                r.read_tagged(Tag::context(1), |r| r.read_bitvec_bytes().map(|(b, _)| b))
            })?;
            Ok((curve, point))
        })
    })
}

/// The public key of a PKCS#8 `OneAsymmetricKey` (RFC 5958): RSA from its inner key, EC from
/// its inner key's point (with the curve of either), any other algorithm from its optional
/// `publicKey`.
fn pkcs8(der: &[u8]) -> ASN1Result<Option<Vec<u8>>> {
    let (algorithm, parameters, inner, public) = yasna::parse_der(der, |r| {
        r.read_sequence(|r| {
            r.next().read_der()?; // version
            let (algorithm, parameters) = r.next().read_sequence(|r| {
                let oid = r.next().read_oid()?;
                let parameters = r.read_optional(|r| r.read_der())?;
                Ok((oid, parameters))
            })?;
            let inner = r.next().read_bytes()?;
            r.read_optional(|r| r.read_tagged_implicit(Tag::context(0), |r| r.read_der()))?;
            let public = r.read_optional(|r| {
                r.read_tagged_implicit(Tag::context(1), |r| r.read_bitvec_bytes().map(|(b, _)| b))
            })?;
            Ok((oid_of(algorithm), parameters, inner, public))
        })
    })?;
    match algorithm.as_slice() {
        RSA => rsa(&inner).map(Some),
        EC => {
            let (curve, point) = sec1(&inner)?;
            let curve = match (curve, parameters) {
                (Some(curve), _) => Some(curve),
                (None, Some(p)) => Some(yasna::parse_der(&p, |r| r.read_oid())?),
                (None, None) => None,
            };
            Ok(curve
                .zip(point.or(public))
                .map(|(curve, point)| ec(&curve, &point)))
        }
        other => Ok(public.map(|point| {
            let oid = ObjectIdentifier::from_slice(other);
            spki(|w| w.next().write_oid(&oid), &point)
        })),
    }
}

fn oid_of(oid: ObjectIdentifier) -> Vec<u64> {
    oid.components().clone()
}

fn ec(curve: &ObjectIdentifier, point: &[u8]) -> Vec<u8> {
    spki(
        |w| {
            w.next().write_oid(&ObjectIdentifier::from_slice(EC));
            w.next().write_oid(curve);
        },
        point,
    )
}

/// `SubjectPublicKeyInfo ::= SEQUENCE { algorithm AlgorithmIdentifier, subjectPublicKey BIT
/// STRING }` (RFC 5280), the algorithm's fields written by `algorithm`.
fn spki(algorithm: impl FnOnce(&mut yasna::DERWriterSeq<'_>), key: &[u8]) -> Vec<u8> {
    yasna::construct_der(|w: DERWriter<'_>| {
        w.write_sequence(|w| {
            w.next().write_sequence(algorithm);
            w.next().write_bitvec_bytes(key, key.len() * 8);
        });
    })
}

#[cfg(test)]
mod tests;
