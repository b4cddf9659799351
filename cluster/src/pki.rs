//! The cluster's certificates, made once per `up` by rcgen: one CA, the API server's serving
//! certificate (loopback and the in-cluster names), a client certificate per component (kubelet's
//! as `system:node:<node>` in `system:nodes`, which the Node authorizer and NodeRestriction key
//! on), kubelet's serving certificate and the service-account signing key. The CA's key stays in
//! the directory (a test cluster's, removed by `down`) so that a node joining later gets its own
//! kubelet certificates from the same CA ([`node`]).
use std::fs;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
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
    if dir.join("ca.key").exists() && dir.join("service-account.pub").exists() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let put = |name: &str, pem: String| -> Result<()> {
        let p = dir.join(name);
        fs::write(&p, pem).map_err(Error::io(&p))
    };

    let ca_key = KeyPair::generate()?;
    put("ca.key", ca_key.serialize_pem())?;
    let ca = CertifiedIssuer::self_signed(ca_params()?, ca_key)?;
    put("ca.crt", ca.pem())?;
    let issue = |stem: &str, cn: &str, o: Option<&str>, sans: &[&str], usage| {
        issue(dir, &ca, stem, cn, o, sans, usage)
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
    node_certs(dir, &ca, NODE_NAME, "kubelet")?;
    for (stem, cn, o) in CLIENTS {
        issue(stem, cn, *o, &[], ExtendedKeyUsagePurpose::ClientAuth)?;
    }
    // ECDSA P-256: the API server signs tokens with it (ES256) and verifies them with the
    // public half (which it will not derive from a PKCS#8 private key).
    let sa = KeyPair::generate()?;
    put("service-account.pub", sa.public_key_pem())?;
    put("service-account.key", sa.serialize_pem())
}

/// Issues a joining node's kubelet certificates from the cluster's CA: `<stem>.crt`/`.key`
/// (the client one, `system:node:<name>` in `system:nodes`) and `<stem>-serving.crt`/`.key`.
pub fn node(dir: &Path, name: &str, stem: &str) -> Result<()> {
    let key_path = dir.join("ca.key");
    let pem = fs::read_to_string(&key_path).map_err(Error::io(&key_path))?;
    // The issuer is the CA's name, key usages and key: what signing needs of it, rebuilt from
    // the same parameters and the kept key.
    let ca = Issuer::new(ca_params()?, KeyPair::from_pem(&pem)?);
    node_certs(dir, &ca, name, stem)
}

fn node_certs(dir: &Path, ca: &Issuer<'_, KeyPair>, name: &str, stem: &str) -> Result<()> {
    let user = format!("system:node:{name}");
    issue(
        dir,
        ca,
        &format!("{stem}-serving"),
        &user,
        Some("system:nodes"),
        &["127.0.0.1", "localhost", name],
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    issue(
        dir,
        ca,
        stem,
        &user,
        Some("system:nodes"),
        &[],
        ExtendedKeyUsagePurpose::ClientAuth,
    )
}

fn ca_params() -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name = dn("observer-cluster-ca", None);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

fn issue(
    dir: &Path,
    ca: &Issuer<'_, KeyPair>,
    stem: &str,
    cn: &str,
    o: Option<&str>,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> Result<()> {
    let put = |name: &str, pem: String| -> Result<()> {
        let p = dir.join(name);
        fs::write(&p, pem).map_err(Error::io(&p))
    };
    let key = KeyPair::generate()?;
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name = dn(cn, o);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, ca)?;
    put(&format!("{stem}.crt"), cert.pem())?;
    put(&format!("{stem}.key"), key.serialize_pem())
}

fn dn(cn: &str, o: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = o {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}
