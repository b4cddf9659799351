//! The cluster's certificates, made once per `up` by rcgen: one CA, the API server's serving
//! certificate (loopback and the in-cluster names), a client certificate per component (kubelet's
//! as `system:node:<node>` in `system:nodes`, which the Node authorizer and NodeRestriction key
//! on), kubelet's serving certificate and the service-account signing key.
use std::fs;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::{Error, Result, NODE_NAME};

/// (file stem, common name, organization) of each client certificate.
const CLIENTS: &[(&str, &str, Option<&str>)] = &[
    ("admin", "kubernetes-admin", Some("system:masters")),
    ("controller-manager", "system:kube-controller-manager", None),
    ("scheduler", "system:kube-scheduler", None),
    (
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
    ),
];

pub fn ensure(dir: &Path) -> Result<()> {
    if dir.join("ca.crt").exists() && dir.join("service-account.pub").exists() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let put = |name: &str, pem: String| -> Result<()> {
        let p = dir.join(name);
        fs::write(&p, pem).map_err(Error::io(&p))
    };

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = dn("observer-cluster-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    put("ca.crt", ca.pem())?;

    let issue = |stem: &str, cn: &str, o: Option<&str>, sans: &[&str], usage| -> Result<()> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name = dn(cn, o);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &*ca)?;
        put(&format!("{stem}.crt"), cert.pem())?;
        put(&format!("{stem}.key"), key.serialize_pem())
    };
    issue(
        "apiserver",
        "kube-apiserver",
        None,
        &[
            "127.0.0.1",
            "10.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    issue(
        "kubelet-serving",
        &format!("system:node:{NODE_NAME}"),
        Some("system:nodes"),
        &["127.0.0.1", "localhost", NODE_NAME],
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    issue(
        "kubelet",
        &format!("system:node:{NODE_NAME}"),
        Some("system:nodes"),
        &[],
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    for (stem, cn, o) in CLIENTS {
        issue(stem, cn, *o, &[], ExtendedKeyUsagePurpose::ClientAuth)?;
    }
    // ECDSA P-256: the API server signs tokens with it (ES256) and verifies them with the
    // public half (which it will not derive from a PKCS#8 private key).
    let sa = KeyPair::generate()?;
    put("service-account.pub", sa.public_key_pem())?;
    put("service-account.key", sa.serialize_pem())
}

fn dn(cn: &str, o: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = o {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}
