//! deploy/'s manifests read into k8s-openapi types, strictly: serde would drop a misspelled field
//! silently, so every document is also serialized back and compared with what the file says. A
//! field the typed object does not keep (a typo, a field of another API version) fails the read.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// The repository's deploy/ directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("deploy")
}

/// Every YAML document of `path`, as JSON values (empty documents skipped).
pub fn documents(path: &Path) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("parsing {} as YAML", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `doc` as a `T`, refusing any field `T` does not keep.
pub fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T> {
    let typed: T = serde_json::from_value(doc.clone())
        .with_context(|| format!("{} does not fit its type", describe(doc)))?;
    let back = serde_json::to_value(&typed)?;
    let mut lost = Vec::new();
    diff(doc, &back, String::new(), &mut lost);
    if !lost.is_empty() {
        bail!(
            "{}: fields the API type does not have (misspelled or misplaced?): {}",
            describe(doc),
            lost.join(", ")
        );
    }
    Ok(typed)
}

/// The single document of `path`, strictly typed.
pub fn read_one<T: DeserializeOwned + Serialize>(path: &Path) -> Result<T> {
    let docs = documents(path)?;
    match docs.as_slice() {
        [doc] => strict(doc).with_context(|| path.display().to_string()),
        _ => bail!(
            "{}: expected one document, found {}",
            path.display(),
            docs.len()
        ),
    }
}

fn describe(doc: &Value) -> String {
    format!(
        "{}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Paths present in `written` that `typed` lacks or holds differently.
fn diff(written: &Value, typed: &Value, at: String, out: &mut Vec<String>) {
    match (written, typed) {
        (Value::Object(w), Value::Object(t)) => {
            for (k, v) in w {
                let path = format!("{at}.{k}");
                match t.get(k) {
                    Some(tv) => diff(v, tv, path, out),
                    // An explicit null or empty list is what serde leaves out.
                    None if v.is_null() || v.as_array().is_some_and(Vec::is_empty) => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(w), Value::Array(t)) if w.len() == t.len() => {
            for (i, (wv, tv)) in w.iter().zip(t).enumerate() {
                diff(wv, tv, format!("{at}[{i}]"), out);
            }
        }
        (Value::Number(w), Value::Number(t)) if w.as_f64() == t.as_f64() => {}
        (w, t) if w == t => {}
        _ => out.push(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    #[test]
    fn a_misspelled_field_is_refused() {
        let doc: Value = serde_saphyr::from_str(
            "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  clusterIp: None\n",
        )
        .unwrap();
        let err = strict::<Service>(&doc).unwrap_err().to_string();
        assert!(err.contains(".spec.clusterIp"), "{err}");
        let ok: Value = serde_saphyr::from_str(
            "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  clusterIP: None\n",
        )
        .unwrap();
        strict::<Service>(&ok).unwrap();
    }

    #[test]
    fn a_wrong_kind_is_refused() {
        let doc: Value =
            serde_saphyr::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n").unwrap();
        assert!(strict::<Service>(&doc).is_err());
    }
}
