use http::{HeaderMap, HeaderName, HeaderValue};

/// `RequestHeaderModifier` / `ResponseHeaderModifier`: set, then add, then remove.
#[derive(Debug, Default, Clone)]
pub struct HeaderModifier {
    pub set: Box<[(HeaderName, HeaderValue)]>,
    /// Appended as another header line, so a receiver joining values sees `old,new`.
    pub add: Box<[(HeaderName, HeaderValue)]>,
    pub remove: Box<[HeaderName]>,
}

impl HeaderModifier {
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in self.set.iter() {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in self.add.iter() {
            headers.append(name.clone(), value.clone());
        }
        for name in self.remove.iter() {
            headers.remove(name);
        }
    }
}
